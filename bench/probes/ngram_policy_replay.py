"""The n-gram speculator's policy knobs, replayed offline: the instruct model's greedy outputs
for bench/spec_decode.py's four tasks (computed here, on --device), then each task re-run
through NgramProposer with a given draft length cap, n-gram sizes and rest-after-miss rule,
accepting drafts against the known greedy continuation. A step's time comes from measured
H100 costs (SmolLM2 Q4_1 decode graph replay by rows, bench/probes/spec_step_probe.py; a
plain overlapped step 1.9 ms, 2.0 ms a token with speculation off; --host-ms for the host work
a drafting or landing step adds). Prints the modelled speedup per task and their mean, the
bench's figure. JSON to bench/results/ngram_policy_replay-*.json.

  python bench/probes/ngram_policy_replay.py [--device cpu] [--host-ms 0.55 0.35]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import print_table, write_result  # noqa: E402
from bench.spec_decode import TASKS, chat_ids  # noqa: E402
from mlxr import LLM, SamplingParams  # noqa: E402
from mlxr.bundled_models import smollm2_135m_path  # noqa: E402
from mlxr.engine.spec_decode.ngram import NgramIndex, NgramProposer  # noqa: E402

REPLAY_MS = {1: 1.94, 2: 1.98, 4: 2.07, 8: 2.27, 12: 2.43, 16: 2.89}  # graph replay by rows (H100)
PLAIN_STEP_MS, OFF_MS_PER_TOKEN = 1.9, 2.0


def replay_ms(rows: int) -> float:
    sizes = sorted(REPLAY_MS)
    for a, b in zip(sizes, sizes[1:]):
        if a <= rows <= b:
            return REPLAY_MS[a] + (REPLAY_MS[b] - REPLAY_MS[a]) * (rows - a) / (b - a)
    return REPLAY_MS[sizes[-1]]


def run(prompt: list[int], out: list[int], host_ms: float, max_k: int, min_n: int, max_n: int, max_rest: int) -> float:
    """Modelled speedup of one task (speculation off / on time for its tokens)."""
    proposer = NgramProposer(max_ngram=max_n, min_ngram=min_n)
    index = NgramIndex(range(min_n, max_n + 1))
    i, ms, k, misses, rest = 0, 0.0, max_k, 0, 0
    while i < len(out):
        if rest:
            rest, i, ms = rest - 1, i + 1, ms + PLAIN_STEP_MS
            continue
        room = len(out) - i - 1
        draft = proposer.lookup(prompt + out[:i], min(k, room), index) if room > 0 else []
        if not draft:
            misses += 1
            rest, i, ms = min(misses, max_rest), i + 1, ms + REPLAY_MS[1] + host_ms
            continue
        misses, kept = 0, 0
        while kept < len(draft) and draft[kept] == out[i + kept]:
            kept += 1
        i, ms = i + kept + 1, ms + replay_ms(1 + len(draft)) + host_ms
        k = min(max_k, len(draft) + 1 if kept == len(draft) else kept + 1)
    return len(out) * OFF_MS_PER_TOKEN / ms


POLICIES = [("k8 n2-4 rest3 (default)", 8, 2, 4, 3), ("k4", 4, 2, 4, 3), ("k12", 12, 2, 4, 3), ("k16", 16, 2, 4, 3),
            ("k8 n1-4", 8, 1, 4, 3), ("k8 n3-6", 8, 3, 6, 3), ("k8 n2-8", 8, 2, 8, 3),
            ("k8 rest0", 8, 2, 4, 0), ("k8 rest1", 8, 2, 4, 1), ("k8 rest8", 8, 2, 4, 8)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--host-ms", type=float, nargs="+", default=[0.55, 0.35])
    args = ap.parse_args()
    llm = LLM(str(smollm2_135m_path()), device=args.device)
    prompts = [chat_ids(llm.tokenizer, t) for t in TASKS]
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=128, temperature=0))]
    llm.shutdown()
    rows = []
    for host in args.host_ms:
        for name, *knobs in POLICIES:
            per_task = [run(p, o, host, *knobs) for p, o in zip(prompts, outs)]
            rows.append({"host_ms": f"{host:.2f}", "policy": name, "per_task": " ".join(f"{x:.2f}" for x in per_task),
                         "mean": f"{sum(per_task) / len(per_task):.3f}"})
    print_table(rows, ["host_ms", "policy", "per_task", "mean"])
    print(write_result("ngram_policy_replay", {"device": args.device, "output_tokens": [len(o) for o in outs],
                                               "rows": rows}))


if __name__ == "__main__":
    main()
