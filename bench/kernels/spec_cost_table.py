"""The step costs that speculation under batch plans from (mlxr/engine/spec_decode/batch_policy.py):
for each batch b, a plain decode step's time, and a drafting step's time with k drafts on every
row, measured through the real engine (scheduler, runner, sampler, verification, the landing a
drafting step waits for). The drafts come from an oracle that knows each prompt's greedy answer
(a plain run first), so every draft is kept and each row carries exactly k drafts a step;
a step's time is the decode phase's wall time over the steps the scheduler ran.

    python bench/kernels/spec_cost_table.py --device cpu|cuda [--batches 1 4 16 64] [--drafts 1 2 4 8]
                                            [--max-tokens 48] [--repeats 2] [--write]
--write puts the device's entry into mlxr/engine/spec_decode/cost_table.json (by device name:
"cpu", or the CUDA device's name), beside the other devices'; the result JSON goes to
bench/results/<day>/ either way. The plan uses the table's ratios of drafting to plain steps,
so a table measured with one model serves others of its class on the same device."""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import cpu_model, device_name, print_table, write_result  # noqa: E402
from mlxr import LLM, SamplingParams  # noqa: E402
from mlxr.bundled_models import smollm2_135m_path  # noqa: E402
from mlxr.engine.spec_decode.factory import BUNDLED_COST_TABLE  # noqa: E402
from mlxr.engine.spec_decode.proposer import Draft, DraftRequest  # noqa: E402


class OracleProposer:
    """Drafts the next k tokens of each prompt's known greedy answer."""

    def __init__(self, answers: dict[tuple[int, ...], list[int]], k: int) -> None:
        self.answers, self.k = answers, k

    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        out = []
        for r in requests:
            answer = self.answers[tuple(r.token_ids[:r.num_prompt_tokens])]
            done = len(r.token_ids) - r.num_prompt_tokens
            out.append(Draft(answer[done:done + min(self.k, r.num_drafts)]))
        return out

    def retain(self, request_ids: set[str]) -> None:
        pass


class StepCounter:
    """Counts the scheduler's non-empty steps (wrapping its schedule on the instance)."""

    def __init__(self, scheduler) -> None:
        self.steps, inner = 0, scheduler.schedule

        def schedule(*a, **kw):
            out = inner(*a, **kw)
            self.steps += not out.is_empty
            return out

        scheduler.schedule = schedule


def run(llm: LLM, counter: StepCounter, prompts: list[list[int]], max_tokens: int, spec: bool) -> tuple[float, int, list]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, speculative=spec)
    before = counter.steps
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    return time.perf_counter() - t0, counter.steps - before, [o.outputs[0].token_ids for o in outs]


def step_ms(llm, counter, prompts, max_tokens: int, spec: bool, repeats: int) -> tuple[float, list]:
    """The decode phase's time a step: (wall - the prefill run's wall) / (steps - its steps), best of repeats."""
    best, tokens = float("inf"), None
    for _ in range(repeats):
        w1, s1, _ = run(llm, counter, prompts, 1, spec)
        w, s, tokens = run(llm, counter, prompts, max_tokens, spec)
        best = min(best, (w - w1) * 1e3 / max(1, s - s1))
    return best, tokens


def measure(args) -> dict:
    k_max = max(args.drafts)
    llm = LLM(args.model, device=args.device, speculative_method="ngram", num_speculative_tokens=k_max,
              max_num_seqs=max(args.batches), speculative_max_batch=max(args.batches), speculative_cost_table="none",
              enable_prefix_caching=False, engine_process=False)
    core = llm.engine.core.core
    counter, spec = StepCounter(core.scheduler), core.speculator
    rng = random.Random(0)
    plain, drafting, per_row = [], [], {}
    for b in args.batches:
        prompts = [[rng.randrange(100, 20_000) for _ in range(args.prompt_tokens)] for _ in range(b)]
        run(llm, counter, prompts, 4, False)  # the batch size's one-off costs
        ms, answers = step_ms(llm, counter, prompts, args.max_tokens, False, args.repeats)
        plain.append(ms)
        table = {tuple(p): a for p, a in zip(prompts, answers)}
        row = []
        for k in args.drafts:
            spec.proposer = OracleProposer(table, k)
            before = llm.engine.stats()
            ms, tokens = step_ms(llm, counter, prompts, args.max_tokens, True, args.repeats)
            assert tokens == answers, "drafted output differs from plain: the oracle's drafts were rejected"
            row.append(ms)
            after = llm.engine.stats()  # a step's rows are bounded (the largest CUDA graph): fewer drafts fit
            rows_drafted = after.spec_num_drafts - before.spec_num_drafts
            per_row[f"{b}x{k}"] = (after.spec_num_draft_tokens - before.spec_num_draft_tokens) / max(1, rows_drafted)
        drafting.append(row)
        print_table([{"batch": b, "plain_ms": plain[-1], **{f"k={k}_ms": t for k, t in zip(args.drafts, row)}}],
                    ["batch", "plain_ms", *[f"k={k}_ms" for k in args.drafts]])
    llm.shutdown()
    return {"batches": list(args.batches), "drafts": list(args.drafts), "plain_ms": plain, "drafting_ms": drafting,
            "mean_drafts_per_row": per_row}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=str(smollm2_135m_path()))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--drafts", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, help="torch's CPU threads (on a shared CPU, 1 keeps the ratios steadier)")
    ap.add_argument("--write", action="store_true", help="put this device's entry into the bundled table")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    entry = measure(args)
    name = "cpu" if args.device == "cpu" else device_name(args.device)
    entry["measured"] = {"device": device_name(args.device), "cpu": cpu_model(), "model": Path(args.model).name,
                         "max_tokens": args.max_tokens, "load1": os.getloadavg()[0]}
    if args.write:
        table = json.loads(BUNDLED_COST_TABLE.read_text()) if BUNDLED_COST_TABLE.exists() else {"devices": {}}
        table.setdefault("devices", {})[name] = entry
        BUNDLED_COST_TABLE.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {name!r} into {BUNDLED_COST_TABLE}")
    print(write_result("spec_cost_table", {"device": device_name(args.device), "entry_name": name, "entry": entry,
                                           "args": vars(args)}))


if __name__ == "__main__":
    main()
