"""Where an n-gram speculative step's time goes at batch 1 (the instruct model, a rewrite task):
tok/s with speculation off and on at a few draft lengths, the decode graph's replay time by
rows (a verifying row of 1 + k tokens replays the graph of 1 + k rows), and a host profile of
the speculating run. Printed; JSON to bench/results/spec_step_probe-*.json.

  python bench/probes/spec_step_probe.py --device cuda [--ks 4 8] [--max-tokens 128]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import device_name, write_result  # noqa: E402
from bench.spec_decode import TASKS, chat_ids, timed  # noqa: E402
from mlxr import LLM  # noqa: E402
from mlxr.bundled_models import smollm2_135m_path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_probe import replay_ms  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    rows = []
    for k in args.ks:
        llm = LLM(str(smollm2_135m_path()), device=args.device, speculative_method="ngram", num_speculative_tokens=k,
                  engine_process=False)  # in this process, so the profile sees the core
        ids = [chat_ids(llm.tokenizer, t) for t in TASKS]
        timed(llm, ids[:1], 8, True)
        for task, p in enumerate(ids):
            off, n_off, _ = timed(llm, [p], args.max_tokens, False)
            on, n_on, _ = timed(llm, [p], args.max_tokens, True)
            rows.append({"k": k, "task": task, "off_tok_s": n_off / off, "on_tok_s": n_on / on,
                         "speedup": (n_on / on) / (n_off / off)})
            print(rows[-1], flush=True)
        if k == args.ks[0] and args.device.startswith("cuda"):
            replays = {b: replay_ms(llm, b) for b in (1, 2, 4, 8, 12, 16)}
            print("decode graph replay ms by rows:", replays, flush=True)
            rows.append({"graph_replay_ms": replays})
        prof = cProfile.Profile()
        prof.enable()
        timed(llm, ids[2:3], args.max_tokens, True)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(args.top)
        print(f"--- host profile, k={k}, speculating ---\n{text.getvalue()}")
        llm.shutdown()
    write_result("spec_step_probe", {"device": device_name(args.device), "rows": rows})


if __name__ == "__main__":
    main()
