"""Batched decode on a GPU, repeated: tok/s and the decode phase's step-time distribution per
run, with Python's cyclic GC on and off, to tell steady-state host cost from pauses.
JSON to bench/results/batch_probe-*.json.

  python bench/probes/batch_probe.py [--batches 64 256] [--repeats 3]
"""
from __future__ import annotations

import argparse
import gc

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, throughput)
from common import device_name, print_table, write_result
from latency import model_paths
from throughput import run_mlxr, workload


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    from mlxr import LLM

    llm = LLM(model_paths("tinyllama-shape")[0], dtype=torch.bfloat16, device="cuda", engine_process=False, max_num_seqs=256,
              max_num_batched_tokens=8192, kv_cache_memory_gb=16)
    vocab = llm.args.vocab_size
    run_mlxr(llm, workload(vocab, 2, 16, 4, False), "cuda")
    rows = []
    for gc_on in (True, False):
        (gc.enable if gc_on else gc.disable)()
        for b in a.batches:
            for r in range(a.repeats):
                res = run_mlxr(llm, workload(vocab, b, 128, 128, False, seed=r), "cuda")
                rows.append({"gc": gc_on, "batch": b, "repeat": r, **{k: res[k] for k in (
                    "decode_tok_s", "decode_step_ms_p50", "decode_step_ms_p90", "decode_step_ms_sum_over_3x_median", "steps")}})
    gc.enable()
    path = write_result("batch_probe", {"model": "tinyllama-shape", "dtype": "bfloat16", "device": device_name("cuda"),
                                        "results": rows})
    print_table(rows, list(rows[0]))
    print(path)


if __name__ == "__main__":
    main()
