"""The batched-decode products on a GPU: cuBLAS (F.linear) beside mlxr/ops/linear/gemm_rows_triton.py over
its launch configurations, for the TinyLlama shape's five matrices at the given batch rows. Each
is timed as calls inside a CUDA graph with the weights cycled through enough copies to miss L2
(as in a step, which reads each weight once), and reported in us and GB/s of weight bytes,
with the 22-layer totals; the kernel's table (rows_config) comes from it. Printed; JSON to
bench/results/gemm_rows_sweep-*.json (MLXR_BENCH_RESULTS=$OUT on the device machine).

2026-11-28, H200, 64 rows, us a call cuBLAS / best of this kernel: q/k/v 6.2 / 6.1, o 6.2 / 5.4,
gate_up 14.5 / 14.9, down 10.5 / 11.1, lm_head 37.7 / 34.9; at 256 rows cuBLAS won every shape
(1,080 / 1,416 us a step). (Printed; that run wrote its JSON on the device only.)

  python bench/probes/gemm_rows_sweep.py [--rows 64 256] [--quick]
"""
from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F

import bench_path  # noqa: F401,I001  (bench/ on sys.path)
from common import device_name, print_table, write_result
from gemv import SHAPES, copy_gbs, graph_us, weights


def configs(m: int, quick: bool) -> list[dict]:
    bms = sorted({min(max(16, 1 << (m - 1).bit_length()), cap) for cap in (64, 128)})
    grid = itertools.product(bms, (16, 32, 64, 128), (64, 128, 256), (4, 8), (3, 4, 6))
    return [{"block_m": bm, "block_n": bn, "block_k": bk, "num_warps": warps, "num_stages": stages}
            for bm, bn, bk, warps, stages in grid if not (quick and (stages == 6 or bk == 256 or warps == 8))]


def sweep_shape(m: int, n: int, k: int, quick: bool) -> dict:
    from mlxr.ops.linear.gemm_rows_triton import gemm_rows_triton

    ws = weights(n, k, warm=False)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ ws[0].float().T
    cublas_us = graph_us([lambda w=w: F.linear(x, w) for w in ws])
    best = None
    for cfg in configs(m, quick):
        try:
            gemm_rows_triton(x, ws[0], out, **cfg)
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            assert err < 2e-2, f"{cfg}: relative error {err}"
            us = graph_us([lambda w=w: gemm_rows_triton(x, w, out, **cfg) for w in ws])
        except AssertionError:
            raise
        except Exception:  # noqa: BLE001 - a config the compiler refuses (shared memory, registers)
            continue
        if best is None or us < best[0]:
            best = (us, cfg)
    gb = n * k * 2 / 1e9
    return {"cublas_us": cublas_us, "triton_us": best[0], "cublas_GB_s": gb / cublas_us * 1e6,
            "triton_GB_s": gb / best[0] * 1e6, "config": best[1]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    p.add_argument("--quick", action="store_true", help="fewer configurations (no 8 warps, 6 stages, BK 256)")
    a = p.parse_args()
    rows = []
    for m in a.rows:
        totals = {"cublas_us": 0.0, "triton_us": 0.0}
        for name, (n, k) in SHAPES.items():
            r = {"rows": m, "op": name, **sweep_shape(m, n, k, a.quick)}
            rows.append(r)
            per_step = 1 if name == "lm_head" else 22
            for key in totals:
                totals[key] += r[key] * per_step
            print({key: (round(v, 1) if isinstance(v, float) else v) for key, v in r.items()}, flush=True)
        rows.append({"rows": m, "op": "step (22 layers + lm_head)", **totals})
    path = write_result("gemm_rows_sweep", {"device": device_name("cuda"), "dtype": "bfloat16",
                                            "copy_GB_s": copy_gbs(), "results": rows})
    print_table(rows, ["rows", "op", "cublas_us", "triton_us", "cublas_GB_s", "triton_GB_s"])
    print(f"-> {path}")


if __name__ == "__main__":
    main()
