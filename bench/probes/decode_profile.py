"""Where a plain decode step's host time goes, and whether a batch's greedy outputs repeat: the
instruct model (or --model PATH), B greedy requests, tok/s of two identical runs (outputs
compared), then a cProfile of a third run sorted by own time. --speculative: the engine has an
n-gram speculator and each batch is profiled with requests that opt out and that opt in. Printed; JSON to
bench/results/decode_profile-*.json.

  python bench/probes/decode_profile.py --device cuda [--batches 1 64] [--max-tokens 128]
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


def top_entries(prof: cProfile.Profile, n: int) -> tuple[str, list[dict]]:
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text).sort_stats("tottime")
    stats.print_stats(n)
    rows = []
    for (file, line, name), (_, calls, tottime, cumtime, _) in sorted(
            stats.stats.items(), key=lambda kv: -kv[1][2])[:n]:
        rows.append({"function": f"{Path(file).name}:{line}:{name}", "calls": calls,
                     "tottime_s": round(tottime, 5), "cumtime_s": round(cumtime, 5)})
    return text.getvalue(), rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default=None, help="a model path (default: the bundled instruct model)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--speculative", action="store_true")
    args = ap.parse_args()
    spec = {"speculative_method": "ngram", "num_speculative_tokens": 4} if args.speculative else {}
    llm = LLM(args.model or str(smollm2_135m_path()), device=args.device, max_num_seqs=max(args.batches),
              engine_process=False, **spec)  # in this process, so the profile sees the core
    ids = [chat_ids(llm.tokenizer, t) for t in TASKS]
    timed(llm, ids[:1], 8, False)
    rows = []
    for batch, opt_in in [(b, s) for b in args.batches for s in ((False, True) if args.speculative else (False,))]:
        prompts = [ids[i % len(ids)] for i in range(batch)]
        runs = [timed(llm, prompts, args.max_tokens, opt_in) for _ in range(2)]
        prof = cProfile.Profile()
        prof.enable()
        dt, n, _ = timed(llm, prompts, args.max_tokens, opt_in)
        prof.disable()
        text, top = top_entries(prof, args.top)
        row = {"batch": batch, "speculative": opt_in, "tok_s": [r[1] / r[0] for r in runs], "profiled_tok_s": n / dt,
               "repeat_identical": runs[0][2] == runs[1][2],
               "rows_differing": sum(a != b for a, b in zip(runs[0][2], runs[1][2])), "top": top}
        rows.append(row)
        print({k: v for k, v in row.items() if k != "top"}, flush=True)
        print(f"--- host profile, batch {batch}, speculative {opt_in} ---\n{text}", flush=True)
    llm.shutdown()
    print(write_result("decode_profile", {"device": device_name(args.device), "model": args.model or "smollm2:135m",
                                          "max_tokens": args.max_tokens, "rows": rows}))


if __name__ == "__main__":
    main()
