"""Decode-shaped matrix products on a GPU: torch (cuBLAS) beside the Triton GEMVs over their
launch configurations, each timed as calls inside a CUDA graph (as the decode step runs them)
with the weights cycled through enough copies to miss L2 (as in a step, where each weight is
read once), in GB/s of weight bytes next to the device's copy bandwidth. JSON to
bench/results/gemv-*.json.

  python bench/probes/gemv.py [--rows 1 4] [--warm]
"""
from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, throughput)
from common import device_name, print_table, write_result

# The TinyLlama shape's decode matrices (q/k/v and gate/up merged), plus its lm_head.
SHAPES = {"qkv": (2560, 2048), "o": (2048, 2048), "gate_up": (11264, 2048), "down": (2048, 5632),
          "lm_head": (32000, 2048)}
CONFIGS = list(itertools.product((1, 2, 4, 8), (256, 512, 1024), (2, 4, 8)))
L2_MISS_BYTES = 512 << 20


def graph_us(fns: list, calls: int = 24, reps: int = 10) -> float:
    """Microseconds per call of fns[i % len(fns)] for i in range(calls), replayed in a graph."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
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
    us = graph_us([lambda: b.copy_(a)], calls=5, reps=5)
    return 2 * a.numel() / us / 1e3


def weights(n: int, k: int, warm: bool) -> list[torch.Tensor]:
    copies = 1 if warm else max(2, -(-L2_MISS_BYTES // (n * k * 2)))
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]


def best_config(fn_for, ws) -> tuple[float, str]:
    """Fastest (us, config) of fn_for(w, bn, bk, warps) over CONFIGS."""
    best = None
    for bn, bk, warps in CONFIGS:
        try:
            us = graph_us([fn_for(w, bn, bk, warps) for w in ws])
        except Exception:  # noqa: BLE001 - a config the compiler refuses (registers)
            continue
        if best is None or us < best[0]:
            best = (us, f"BN{bn} BK{bk} w{warps}")
    return best


def plain_rows(m: int, warm: bool) -> list[dict]:
    from mlxr.ops.linear.gemv_triton import gemv_triton

    rows = []
    for name, (n, k) in SHAPES.items():
        ws = weights(n, k, warm)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ ws[0].float().T
        gemv_triton(x, ws[0], out)
        assert ((out.float() - ref).abs().max() / ref.abs().max()).item() < 2e-2
        torch_us = graph_us([lambda w=w: F.linear(x, w) for w in ws])
        default_us = graph_us([lambda w=w: gemv_triton(x, w, out) for w in ws])
        us, config = best_config(lambda w, bn, bk, warps: (lambda: gemv_triton(x, w, out, bn, bk, warps)), ws)
        gb = n * k * 2 / 1e9
        rows.append({"op": name, "rows": m, "torch_us": torch_us, "default_us": default_us, "best_us": us,
                     "best_GB_s": gb / us * 1e6, "config": config})
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1])
    p.add_argument("--warm", action="store_true", help="one weight copy, L2-resident (the old figures)")
    a = p.parse_args()
    ceiling = copy_gbs()
    plain = [r for m in a.rows for r in plain_rows(m, a.warm)]
    path = write_result("gemv", {"device": device_name("cuda"), "dtype": "bfloat16", "l2": "warm" if a.warm else "cold",
                                 "copy_GB_s": ceiling, "results": plain})
    print_table(plain, ["op", "rows", "torch_us", "default_us", "best_us", "best_GB_s", "config"])
    print(f"copy {ceiling:,.0f} GB/s -> {path}")


if __name__ == "__main__":
    main()
