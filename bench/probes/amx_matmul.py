"""quant.c's prompt matmul with AMX tiles against the same call with MLXR_AMX=0 (the AVX-512
VNNI kernel), interleaved call by call on the same random weights and activations, at prompt row
counts. Needs a build for a CPU with AMX-INT8 (quant_cpu.amx()); elsewhere it says so and stops.

  python bench/probes/amx_matmul.py [--rows 32 128 512] [--threads 2] [--repeats 20]

The shapes are prefill_matmul.py's (TinyLlama's and Gemma 3 270M's Q4_K_M linears). JSON to
bench/results/<day>/amx_matmul-*.json: per shape and row count the medians of both, their ratio,
and the largest difference between the two results relative to the output's scale (both see
the same 16-bit activations). Below a type's minimum rows (quant_cpu.amx_min_rows) both calls
run the VNNI kernel.
"""
from __future__ import annotations

import argparse
import os
import time

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common)
from common import cpu_model, median, print_table, write_result
from prefill_matmul import SHAPES, weights

from mlxr.ops.quant import quant_cpu


def timed(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int, amx: bool) -> tuple[float, torch.Tensor]:
    os.environ["MLXR_AMX"] = "1" if amx else "0"  # quant_amx.h reads it on every call
    t0 = time.perf_counter()
    y = quant_cpu.qmatmul_cpu(x, raw, qtype, k)
    return time.perf_counter() - t0, y


def shape_row(qtype: str, n: int, k: int, m: int, repeats: int) -> dict:
    raw, x = weights(qtype, n, k), torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    on, off = [], []
    for _ in range(repeats):
        t_on, y_on = timed(x, raw, qtype, k, True)
        t_off, y_off = timed(x, raw, qtype, k, False)
        on.append(t_on)
        off.append(t_off)
    diff = ((y_on - y_off).abs().max() / y_off.abs().max().clamp_min(1e-30)).item()
    return {"type": qtype, "n": n, "k": k, "rows": m, "amx_ms": 1e3 * median(on), "vnni_ms": 1e3 * median(off),
            "speedup": median(off) / median(on), "max_rel_diff": diff}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[32, 128, 512])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    saved = os.environ.get("MLXR_AMX")
    if not quant_cpu.amx():
        print(f"no AMX on this build or CPU ({quant_cpu.kernel_path()}): nothing to compare")
        return
    try:
        rows = [shape_row(qtype, n, k, m, a.repeats) for qtype, n, k in SHAPES for m in a.rows]
    finally:
        os.environ.pop("MLXR_AMX", None) if saved is None else os.environ.update(MLXR_AMX=saved)
    print_table(rows, ["type", "n", "k", "rows", "amx_ms", "vnni_ms", "speedup", "max_rel_diff"])
    print(write_result("amx_matmul", {"cpu": cpu_model(), "threads": a.threads, "kernel_path": quant_cpu.kernel_path(),
                                      "repeats": a.repeats, "rows": rows}))


if __name__ == "__main__":
    main()
