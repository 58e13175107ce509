"""Decode-shaped matrix products on a GPU: torch (cuBLAS) beside the Triton GEMV over its
launch configurations, each timed as 20 calls inside a CUDA graph (as the decode step runs
them), in GB/s of weight bytes next to the device's copy bandwidth.
JSON to bench/results/gemv-*.json.

  python bench/gemv.py [--rows 1 4]
"""
from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F

from common import device_name, print_table, write_result

# The TinyLlama shape's decode matrices (q/k/v and gate/up merged), plus its lm_head.
SHAPES = {"qkv": (2560, 2048), "o": (2048, 2048), "gate_up": (11264, 2048), "down": (2048, 5632),
          "lm_head": (32000, 2048)}
CONFIGS = list(itertools.product((2, 4, 8, 16), (256, 512, 1024), (2, 4, 8)))


def graph_us(fn, calls: int = 20, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (calls * reps)


def copy_gbs() -> float:
    a = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    us = graph_us(lambda: b.copy_(a), calls=5, reps=5)
    return 2 * a.numel() / us / 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    a = p.parse_args()
    from mlxr.ops.gemv_triton import gemv_triton

    rows, ceiling = [], copy_gbs()
    for (name, (n, k)), m in itertools.product(SHAPES.items(), a.rows):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ w.float().T
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        torch_us = graph_us(lambda: F.linear(x, w))
        best = None
        for bn, bk, warps in CONFIGS:
            fn = lambda: gemv_triton(x, w, out, bn, bk, warps)  # noqa: E731
            fn()
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            assert err < 2e-2, (name, m, bn, bk, warps, err)
            us = graph_us(fn)
            if best is None or us < best[0]:
                best = (us, bn, bk, warps)
        gb = n * k * 2 / 1e9
        rows.append({"matrix": name, "rows": m, "torch_us": torch_us, "torch_GB_s": gb / torch_us * 1e6,
                     "triton_us": best[0], "triton_GB_s": gb / best[0] * 1e6, "config": f"BN{best[1]} BK{best[2]} w{best[3]}",
                     "copy_GB_s": ceiling})
    path = write_result("gemv", {"device": device_name("cuda"), "dtype": "bfloat16", "results": rows})
    print_table(rows, ["matrix", "rows", "torch_us", "torch_GB_s", "triton_us", "triton_GB_s", "config", "copy_GB_s"])
    print(path)


if __name__ == "__main__":
    main()
