"""How close a decode step's bf16 products come to reading the weights at the GPU's memory
speed, by rows (the batch): TinyLlama's four linear shapes, torch's F.linear (cuBLAS) timed
in a CUDA graph of many calls, as achieved GB/s of weight bytes. Printed; JSON to
bench/results/gemm_rows-*.json.

  python bench/probes/gemm_rows.py [--rows 1 8 64 256] [--variants]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import device_name, print_table, write_result  # noqa: E402
from gemv import graph_us  # noqa: E402

SHAPES = {"qkv": (2560, 2048), "o": (2048, 2048), "gate_up": (11264, 2048), "down": (2048, 5632)}  # out, in


def time_ms(fn) -> float:
    """Per call, from a CUDA graph of 50 calls (as the decode graphs run them: no launch cost
    between kernels)."""
    return graph_us([fn], calls=50, reps=20) / 1e3


def variants(x: torch.Tensor, w: torch.Tensor, more: bool) -> dict[str, float]:
    out = {"F.linear": time_ms(lambda: F.linear(x, w))}
    if not more:
        return out
    wt = w.t().contiguous()
    out["x @ w_t stored"] = time_ms(lambda: x @ wt)
    before = torch.backends.cuda.preferred_blas_library()
    for lib in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(lib)
        out[f"F.linear {lib}"] = time_ms(lambda: F.linear(x, w))
    torch.backends.cuda.preferred_blas_library(before)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--variants", action="store_true",
                    help="also cuBLAS against cuBLASLt (torch's preferred BLAS) and weights stored transposed")
    args = ap.parse_args()
    rows = []
    for m in args.rows:
        totals: dict[str, float] = {}
        for name, (n, k) in SHAPES.items():
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for variant, ms in variants(x, w, args.variants).items():
                totals[variant] = totals.get(variant, 0.0) + ms * 22
                rows.append({"rows": m, "shape": name, "variant": variant, "us": round(ms * 1e3, 1),
                             "GB_s": round(w.numel() * 2 / ms / 1e6)})
        rows += [{"rows": m, "shape": "22 layers", "variant": v, "us": round(t * 1e3, 1), "GB_s": ""} for v, t in totals.items()]
    print_table(rows, ["rows", "shape", "variant", "us", "GB_s"])
    print(write_result("gemm_rows", {"device": device_name("cuda"), "rows": rows}))


if __name__ == "__main__":
    main()
