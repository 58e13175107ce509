"""A/B of the n-gram speculator's rest after a miss (speculator.MAX_REST), in one process,
rounds interleaved: each value of --rests against speculation off, batch 1, the instruct
model, bench/spec_decode.py's four tasks. Printed; JSON to bench/results/spec_rest_ab-*.json.

  python bench/probes/spec_rest_ab.py --device cuda [--k 8] [--rests 3 0] [--rounds 5]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import device_name, median, print_table, write_result  # noqa: E402
from bench.spec_decode import TASKS, chat_ids, timed  # noqa: E402
from mlxr import LLM  # noqa: E402
from mlxr.bundled_models import smollm2_135m_path  # noqa: E402
from mlxr.engine.spec_decode import speculator  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--rests", type=int, nargs="+", default=[3, 0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    llm = LLM(str(smollm2_135m_path()), device=args.device, speculative_method="ngram", num_speculative_tokens=args.k,
              engine_process=False)  # in this process, so the patched constant is the core's
    ids = [chat_ids(llm.tokenizer, t) for t in TASKS]
    timed(llm, ids[:1], 8, True)
    names = ["off"] + [f"rest{r}" for r in args.rests]
    rows = []
    for task, p in enumerate(ids):
        rates: dict[str, list[float]] = {n: [] for n in names}
        outs = {}
        for _ in range(args.rounds):
            for name in names:
                if name != "off":
                    speculator.MAX_REST = int(name[4:])
                dt, n, toks = timed(llm, [p], args.max_tokens, name != "off")
                rates[name].append(n / dt)
                outs[name] = toks
        rows.append({"task": task, **{n: round(median(v), 1) for n, v in rates.items()},
                     "identical": all(o == outs["off"] for o in outs.values())})
    mean = {n: sum(r[n] for r in rows) / len(rows) for n in names}
    rows.append({"task": "mean", **{n: round(v, 1) for n, v in mean.items()}, "identical": all(r["identical"] for r in rows)})
    for r in rows:
        for n in names[1:]:
            r[f"{n}_speedup"] = f"{r[n] / r['off']:.3f}"
    print_table(rows, ["task", *names, *[f"{n}_speedup" for n in names[1:]], "identical"])
    print(write_result("spec_rest_ab", {"device": device_name(args.device), "k": args.k, "rounds": args.rounds,
                                        "rows": rows}))


if __name__ == "__main__":
    main()
