"""Data parallelism on the CPU: two engine cores of one CPU each (`data_parallel_size=2`) against
one core with two threads, on the same model, in the same session, runs interleaved.

    python bench/data_parallel.py [--model smollm2:135m] [--reps 2]

Workloads: "batch": 64 requests at once (distinct 64-token prompts, 32 tokens out, greedy);
"chat": a shared-prefix chat workload: 4 system prompts of ~200 tokens, 8 questions each, a
first wave of one question per system prompt then the other 28 at once (32 tokens out).
Each run is a fresh process (its start-up is not timed); the figure is output tokens per second
of wall time over the workload, with the prefix-cache hit tokens and, under DP, the placements.
The ratio is DP over one core. The host is shared: `lscpu`'s model and the load average before
and after go into the JSON with every run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from common import median, print_table, write_result

CONFIGS = {"dp2": {"data_parallel_size": 2}, "one-2threads": {}}
WORKLOADS = ("batch", "chat")
GEN = 32


def lscpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def waves(llm, workload: str) -> list[list[list[int]]]:
    vocab = llm.args.vocab_size
    if workload == "batch":
        return [[[(97 * k + 13 * i) % (vocab - 10) + 5 for i in range(64)] for k in range(64)]]
    tok = llm.tokenizer
    topics = ["a lighthouse keeper", "a chemistry lab", "a mountain railway", "a city library"]
    systems = [f"You are the assistant of {t}. " + " ".join(f"Rule {r}: answer about {t} briefly and kindly."
                                                            for r in range(16)) for t in topics]

    def ask(s: int, q: int) -> list[int]:
        messages = [{"role": "system", "content": systems[s]}, {"role": "user", "content": f"Question {q}: why?"}]
        return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)

    return [[ask(s, 0) for s in range(4)], [ask(s, q) for s in range(4) for q in range(1, 8)]]


def one_run(model: str, config: str, workload: str) -> dict:
    """In this process: build the engine, run the workload, report (printed as JSON)."""
    from mlxr import LLM, SamplingParams

    llm = LLM(model, **CONFIGS[config])
    try:
        params = SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True)
        before = llm.engine.stats()
        t0, out_tokens = time.perf_counter(), 0
        for wave in waves(llm, workload):
            out_tokens += sum(len(o.outputs[0].token_ids) for o in llm.generate(wave, params))
        wall = time.perf_counter() - t0
        after = llm.engine.stats()
        placed = {r: {k: v for k, v in f.items() if k.startswith("placed_")} for r, f in after.data_parallel.items()}
        return {"config": config, "workload": workload, "wall_s": wall, "out_tok_s": out_tokens / wall,
                "prefix_hit_tokens": after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens,
                "placements": placed}
    finally:
        llm.shutdown()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2:135m")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--one", nargs=2, metavar=("CONFIG", "WORKLOAD"), help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.one:
        print(json.dumps(one_run(ns.model, *ns.one)))
        return
    load_before, runs = os.getloadavg(), []
    for rep in range(ns.reps):
        order = list(CONFIGS) if rep % 2 == 0 else list(CONFIGS)[::-1]  # alternate who goes first
        for workload in WORKLOADS:
            for config in order:
                done = subprocess.run([sys.executable, __file__, "--model", ns.model, "--one", config, workload],
                                      capture_output=True, text=True, timeout=900, check=True)
                runs.append({"rep": rep, **json.loads(done.stdout.strip().splitlines()[-1]),
                             "loadavg_1m": os.getloadavg()[0]})
                print(runs[-1], flush=True)
    rows = []
    for workload in WORKLOADS:
        figures = {c: median([r["out_tok_s"] for r in runs if r["config"] == c and r["workload"] == workload])
                   for c in CONFIGS}
        hits = {c: median([r["prefix_hit_tokens"] for r in runs if r["config"] == c and r["workload"] == workload])
                for c in CONFIGS}
        rows.append({"workload": workload, "dp2_tok_s": figures["dp2"], "one_2threads_tok_s": figures["one-2threads"],
                     "ratio": figures["dp2"] / figures["one-2threads"], "dp2_prefix_hits": hits["dp2"],
                     "one_prefix_hits": hits["one-2threads"]})
    print_table(rows, ["workload", "dp2_tok_s", "one_2threads_tok_s", "ratio", "dp2_prefix_hits", "one_prefix_hits"])
    path = write_result("data_parallel", {
        "model": ns.model, "cpu": lscpu_model(), "usable_cpus": len(os.sched_getaffinity(0)), "gen_len": GEN,
        "reps": ns.reps, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "note": "shared host: other agents' processes ran during these runs (see loadavg); configurations "
                "interleaved and their order alternated per rep so that load spreads over both",
        "medians": rows, "runs": runs,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
