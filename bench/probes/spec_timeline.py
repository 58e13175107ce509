"""Step by step, where a batch-1 n-gram speculating run spends its time: for every engine step,
the drafts it carried, the tokens it landed, and its wall time (from one schedule() to the
next), plus the host time between a step's landing and its successor's launch. Summarised
into steps with and without drafts, against the same task with speculation off. Printed;
JSON to bench/results/spec_timeline-*.json.

  python bench/probes/spec_timeline.py --device cuda [--k 4] [--max-tokens 128]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import device_name, median, write_result  # noqa: E402
from bench.spec_decode import TASKS, chat_ids, timed  # noqa: E402
from mlxr import LLM  # noqa: E402
from mlxr.bundled_models import smollm2_135m_path  # noqa: E402


class Timeline:
    """Wraps the scheduler's schedule/update_from_output and the runner's execute."""

    def __init__(self, core) -> None:
        self.events: list[tuple[str, float, int]] = []
        self._wrap(core.scheduler, "schedule", lambda out: ("schedule", len(sum(out.spec_token_ids.values(), []))))
        self._wrap(core.scheduler, "update_from_output",
                   lambda _: ("land", 0), before=lambda out, result: ("landing", sum(map(len, result.sampled_token_ids))))
        self._wrap(core.runner, "execute", lambda _: ("launched", 0))
        self._wrap(core.runner, "forward", lambda _: ("forward_queued", 0), before=lambda *a, **k: ("forward_start", 0))
        import mlxr.engine.worker.model_runner as runner_module
        self._module, self._verify = runner_module, runner_module.sample_with_drafts

        def verify(*args, **kwargs):
            res = self._verify(*args, **kwargs)
            self.events.append(("verified", time.perf_counter(), 0))
            return res
        runner_module.sample_with_drafts = verify

    def unwrap(self, core) -> None:
        for name in ("schedule", "update_from_output"):
            delattr(core.scheduler, name)
        for name in ("execute", "forward"):
            delattr(core.runner, name)
        self._module.sample_with_drafts = self._verify

    def _wrap(self, obj, name, after, before=None) -> None:
        fn = getattr(obj, name)

        def wrapper(*args, **kwargs):
            if before is not None:
                kind, n = before(*args, **kwargs)
                self.events.append((kind, time.perf_counter(), n))
            res = fn(*args, **kwargs)
            kind, n = after(res)
            self.events.append((kind, time.perf_counter(), n))
            return res
        setattr(obj, name, wrapper)

    def host_gaps(self) -> dict:
        """Medians over the steps that follow a verified (drafting) step: ms from the
        verification's end to the next forward's start (landing, proposing, scheduling) and
        from that start to its queued forward (inputs, graph replay)."""
        to_start, to_queued = [], []
        for i, (kind, t, _) in enumerate(self.events):
            if kind != "verified":
                continue
            nxt = [(k, t2) for k, t2, _ in self.events[i + 1:i + 40] if k in ("forward_start", "forward_queued")]
            if len(nxt) >= 2 and nxt[0][0] == "forward_start":
                to_start.append(1e3 * (nxt[0][1] - t))
                to_queued.append(1e3 * (nxt[1][1] - nxt[0][1]))
        return {"after_verify_steps": len(to_start),
                "verified_to_forward_start_ms": median(to_start) if to_start else None,
                "forward_start_to_queued_ms": median(to_queued) if to_queued else None}

    def steps(self) -> list[dict]:
        """One record per scheduled step: drafts, wall time to the next schedule, tokens landed
        for it, and the host time from the previous landing to this step's launch."""
        sched = [(i, t, n) for i, (k, t, n) in enumerate(self.events) if k == "schedule"]
        rows = []
        for (i, t, n), (j, t_next, _) in zip(sched, sched[1:]):
            window = self.events[i:j]
            launched = next((t2 for k, t2, _ in window if k == "launched"), None)
            prev_land = max((t2 for k, t2, _ in self.events[:i] if k == "land"), default=None)
            landed = sum(m for k, _, m in self.events[j:j + 8] if k == "landing")
            rows.append({"drafts": n, "wall_ms": 1e3 * (t_next - t), "tokens": landed,
                         "land_to_launch_ms": None if launched is None or prev_land is None else 1e3 * (launched - prev_land)})
        return rows


def summary(rows: list[dict]) -> dict:
    out = {}
    for name, sel in (("with_drafts", [r for r in rows if r["drafts"]]), ("no_drafts", [r for r in rows if not r["drafts"]])):
        gaps = [r["land_to_launch_ms"] for r in sel if r["land_to_launch_ms"] is not None]
        out[name] = {"steps": len(sel), "median_wall_ms": median([r["wall_ms"] for r in sel]) if sel else None,
                     "mean_drafts": sum(r["drafts"] for r in sel) / len(sel) if sel else None,
                     "mean_tokens": sum(r["tokens"] for r in sel) / len(sel) if sel else None,
                     "median_land_to_launch_ms": median(gaps) if gaps else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    llm = LLM(str(smollm2_135m_path()), device=args.device, speculative_method="ngram", num_speculative_tokens=args.k,
              engine_process=False)
    ids = [chat_ids(llm.tokenizer, t) for t in TASKS]
    timed(llm, ids[:1], 8, True)
    core = llm.engine.core.core
    results = []
    for task, p in enumerate(ids):
        off_dt, off_n, _ = timed(llm, [p], args.max_tokens, False)
        tl = Timeline(core)
        on_dt, on_n, _ = timed(llm, [p], args.max_tokens, True)
        tl.unwrap(core)
        rows = tl.steps()
        res = {"task": task, "off_tok_s": off_n / off_dt, "on_tok_s": on_n / on_dt, "off_ms_per_token": 1e3 * off_dt / off_n,
               **summary(rows), **tl.host_gaps(), "tokens": on_n, "steps": len(rows)}
        results.append(res)
        print(res, flush=True)
    llm.shutdown()
    print(write_result("spec_timeline", {"device": device_name(args.device), "k": args.k, "rows": results}))


if __name__ == "__main__":
    main()
