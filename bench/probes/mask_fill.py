"""llguidance mask fill for a batch of rows of one JSON schema (bench/structured_overhead.py's),
on this host's CPUs: matchers that are copies of one compiled template (LLMatcher.deep_copy,
which shares the template's lexer behind one mutex) against a matcher compiled per row, filled
in this thread or on an LLExecutor of 1, 2, 4, ... threads. The rows replay what the model wrote
under the schema (generated first, on --device), and a fill is timed at every position. JSON to
bench/results/<day>/mask_fill-*.json.

  python bench/probes/mask_fill.py --model smollm2:135m --device cuda [--rows 64] [--steps 48]
"""
from __future__ import annotations

import argparse
import os
import time

import bench_path  # noqa: F401,I001  (bench/ on sys.path)
from common import median, print_table, write_result
from structured_overhead import SCHEMA, cpu_model


def model_paths(llm, rows: int, steps: int) -> list[list[int]]:
    """Each row's tokens as the model writes them under the schema (sampled, one seed a row)."""
    from mlxr import SamplingParams
    from mlxr.types import StructuredOutputsParams

    spec = StructuredOutputsParams(json=SCHEMA)
    outs = llm.generate([f"Write record list number {i} as JSON:" for i in range(rows)],
                        [SamplingParams(max_tokens=steps, temperature=0.8, seed=i, structured_outputs=spec)
                         for i in range(rows)])
    return [list(o.outputs[0].token_ids) for o in outs]


def time_fills(matchers, paths, fill, words: int) -> float:
    """Median seconds of one batch fill over the walk (every matcher takes its path's tokens)."""
    import torch

    mask = torch.full((len(matchers), words), -1, dtype=torch.int32)
    times = []
    for step in range(min(len(p) for p in paths)):
        t0 = time.perf_counter()
        fill(list(zip(matchers, range(len(matchers)))), mask)
        times.append(time.perf_counter() - t0)
        for m, p in zip(matchers, paths):
            m.consume_token(p[step])
    return median(times)


def rows_args() -> argparse.ArgumentParser:
    """The arguments of the mask probes: whose vocabulary and paths, how many rows and steps."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--steps", type=int, default=48)
    return ap


def main() -> None:
    ap = rows_args()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 12])
    a = ap.parse_args()
    import llguidance
    import llguidance.torch as llg_torch

    from mlxr import LLM
    from mlxr.engine.structured.grammar import grammar_text, parser_limits
    from mlxr.types import StructuredOutputsParams

    llm = LLM(a.model, device=a.device, engine_process=False, max_num_seqs=a.rows)
    paths = model_paths(llm, a.rows, a.steps)
    compiler = llm.engine.core.core.structured._compiler
    ll, vocab = compiler.ll_tokenizer(), compiler.vocab_size
    text = grammar_text(StructuredOutputsParams(json=SCHEMA))

    def own():
        return [llguidance.LLMatcher(ll, text, limits=parser_limits(), log_level=0) for _ in range(a.rows)]

    def copies():
        template = llguidance.LLMatcher(ll, text, limits=parser_limits(), log_level=0)
        return [template.deep_copy() for _ in range(a.rows)]

    def serial(pairs, mask):
        for m, i in pairs:
            llg_torch.fill_next_token_bitmask(m, mask, i)

    fills = {"this thread": serial}
    for n in a.threads:
        executor = llguidance.LLExecutor(num_threads=n)
        fills[f"executor {n}"] = lambda pairs, mask, ex=executor: llg_torch.fill_next_token_bitmask_par(ex, pairs, mask)
    rows = []
    for name, fill in fills.items():
        row = {"fill": name}
        for kind, make in (("own", own), ("copies", copies)):
            row[f"{kind}_us_per_row"] = 1e6 * time_fills(make(), paths, fill, (vocab + 31) // 32) / a.rows
        rows.append(row)
        print(row, flush=True)
    print_table(rows, list(rows[0]))
    cores = len(os.sched_getaffinity(0))
    print(write_result("mask_fill", {"model": a.model, "cpu": cpu_model(), "cores": cores, "rows": a.rows,
                                     "steps": a.steps, "positions": min(len(p) for p in paths),
                                     "vocab": vocab, "results": rows}))


if __name__ == "__main__":
    main()
