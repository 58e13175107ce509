"""quant.c's prompt matmul by path, interleaved call by call on the same random weights and
activations, at prompt row counts: AMX tiles (`amx`, where the build and CPU have them), weight
panels on AVX-512 VNNI (`vnni_panels`: MLXR_AMX=0, the path of CPUs without AMX) and the VNNI row
kernel (`vnni_rows`: MLXR_AMX=0 MLXR_VNNI_PANELS=0, the path below the panels' minimum rows).

  python bench/probes/amx_matmul.py [--arms amx vnni_panels vnni_rows] [--rows 32 128 512]
      [--threads 2] [--repeats 20]

The shapes are prefill_matmul.py's (TinyLlama's and Gemma 3 270M's Q4_K_M linears). JSON to
bench/results/<day>/amx_matmul-*.json: per shape and row count the median of each arm, each
arm's speedup over the last, and the largest difference from the last arm's result relative to
the output's scale (all see the same 16-bit activations). Below a path's minimum rows
(quant_cpu.amx_min_rows, quant_cpu.panel_min_rows) its arm runs the row kernel.
"""
from __future__ import annotations

import argparse
import os
import time

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common)
from common import cpu_model, median, print_table, write_result
from prefill_matmul import SHAPES, weights

from mlxr.ops.quant import cpu as quant_cpu

# quant.c reads both variables on every call, so one process can alternate the paths.
ARMS = {"amx": {"MLXR_AMX": "1", "MLXR_VNNI_PANELS": "1"},
        "vnni_panels": {"MLXR_AMX": "0", "MLXR_VNNI_PANELS": "1"},
        "vnni_rows": {"MLXR_AMX": "0", "MLXR_VNNI_PANELS": "0"}}


def timed(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int, arm: str) -> tuple[float, torch.Tensor]:
    os.environ.update(ARMS[arm])
    t0 = time.perf_counter()
    y = quant_cpu.qmatmul_cpu(x, raw, qtype, k)
    return time.perf_counter() - t0, y


def shape_row(qtype: str, n: int, k: int, m: int, arms: list[str], repeats: int) -> dict:
    raw, x = weights(qtype, n, k), torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    out = {}
    for _ in range(repeats):
        for arm in arms:
            t, out[arm] = timed(x, raw, qtype, k, arm)
            times[arm].append(t)
    base = arms[-1]
    row = {"type": qtype, "n": n, "k": k, "rows": m}
    for arm in arms:
        row[f"{arm}_ms"] = 1e3 * median(times[arm])
    for arm in arms[:-1]:
        row[f"{arm}_speedup"] = median(times[base]) / median(times[arm])
        row[f"{arm}_max_rel_diff"] = ((out[arm] - out[base]).abs().max() / out[base].abs().max().clamp_min(1e-30)).item()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=None,
                   help="default: amx vnni_panels vnni_rows, without amx where the build or CPU lacks it")
    p.add_argument("--rows", type=int, nargs="+", default=[32, 128, 512])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if not quant_cpu.vectorized():
        print(f"no AVX-512 VNNI build on this CPU ({quant_cpu.kernel_path()}): nothing to compare")
        return
    arms = a.arms or (["amx"] if quant_cpu.amx() else []) + ["vnni_panels", "vnni_rows"]
    saved = {name: os.environ.get(name) for name in ARMS["amx"]}
    try:
        rows = [shape_row(qtype, n, k, m, arms, a.repeats) for qtype, n, k in SHAPES for m in a.rows]
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.update({name: value})
    columns = ["type", "n", "k", "rows", *(f"{arm}_ms" for arm in arms), *(f"{arm}_speedup" for arm in arms[:-1])]
    print_table(rows, columns)
    print(write_result("amx_matmul", {"cpu": cpu_model(), "threads": a.threads, "kernel_path": quant_cpu.kernel_path(),
                                      "arms": arms, "repeats": a.repeats, "rows": rows}))


if __name__ == "__main__":
    main()
