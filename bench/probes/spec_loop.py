"""A batch-1 n-gram speculating loop over bench/spec_decode.py's tasks, for a sampling profiler
(py-spy) to watch: the four tasks, greedy, speculation on (or off), for --seconds. Prints
tokens/s; nothing else, so a profile sees only the decode loop.

  py-spy record -f raw -r 2000 -o spec.txt [--subprocesses] -- \
      python bench/probes/spec_loop.py --device cuda --k 8 [--engine-process]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.spec_decode import TASKS, chat_ids, timed  # noqa: E402
from mlxr import LLM  # noqa: E402
from mlxr.bundled_models import smollm2_135m_path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--off", action="store_true", help="speculation off (the plain loop)")
    ap.add_argument("--engine-process", action="store_true", help="the engine core in its own process")
    args = ap.parse_args()
    llm = LLM(str(smollm2_135m_path()), device=args.device, speculative_method="ngram",
              num_speculative_tokens=args.k, engine_process=args.engine_process)
    ids = [chat_ids(llm.tokenizer, t) for t in TASKS]
    timed(llm, ids[:1], 8, not args.off)
    tokens, spent, t_end = 0, 0.0, time.perf_counter() + args.seconds
    while time.perf_counter() < t_end:
        for p in ids:
            dt, n, _ = timed(llm, [p], args.max_tokens, not args.off)
            tokens, spent = tokens + n, spent + dt
    print(f"{'off' if args.off else 'on'} k={args.k} engine_process={args.engine_process}: {tokens / spent:.1f} tok/s")


if __name__ == "__main__":
    main()
