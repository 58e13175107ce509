"""Batched decode with Python's default cyclic-collector thresholds against the engine's
(mlxr/engine/core/gc_tuning.py GC_THRESHOLDS), interleaved on one engine, each run on fresh
prompts: what collecting garbage costs a busy decode loop. JSON to bench/results/gc_ab-*.json.

  python bench/probes/gc_ab.py [--device cuda] [--batches 64 256] [--runs 4]
"""
from __future__ import annotations

import argparse
import gc

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, throughput)
from common import device_name, median, print_table, write_result
from latency import model_paths
from throughput import run_mlxr, workload

PYTHON_DEFAULT = (700, 10, 10)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    p.add_argument("--runs", type=int, default=4)
    a = p.parse_args()
    from mlxr import LLM
    from mlxr.engine.core.gc_tuning import GC_THRESHOLDS

    ref, _ = model_paths("tinyllama-shape")
    llm = LLM(ref, dtype=torch.bfloat16, engine_process=False, device=a.device, max_num_seqs=max(a.batches),
              max_num_batched_tokens=8192, kv_cache_memory_gb=16 if a.device == "cuda" else 1)
    vocab = llm.args.vocab_size
    run_mlxr(llm, workload(vocab, 2, 16, 4, False), a.device)  # warm-up
    runs = {}
    for b in a.batches:
        for r in range(a.runs):
            for name, thresholds in (("python_default", PYTHON_DEFAULT), ("engine", GC_THRESHOLDS)):
                gc.set_threshold(*thresholds)
                tok_s = run_mlxr(llm, workload(vocab, b, 128, 128, False, seed=1000 * b + r), a.device)["decode_tok_s"]
                runs.setdefault((b, name), []).append(tok_s)
    gc.set_threshold(*GC_THRESHOLDS)
    rows = [{"batch": b, "thresholds": name, "median_tok_s": median(v), "runs_tok_s": v} for (b, name), v in runs.items()]
    path = write_result("gc_ab", {"model": "tinyllama-shape", "dtype": "bfloat16", "device": device_name(a.device),
                                  "engine_thresholds": list(GC_THRESHOLDS), "results": rows})
    print_table(rows, ["batch", "thresholds", "median_tok_s", "runs_tok_s"])
    print(path)


if __name__ == "__main__":
    main()
