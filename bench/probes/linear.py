"""CPU linear layers by row count: fp32, fp16 storage (torch's GEMV, mlxr/ops/half_linear's
kernel that reads the weights once for all rows, and the upcast path), bf16 storage. Shows where
StoredLinear should switch paths. JSON to bench/results/linear-*.json.

  python bench/probes/linear.py
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, throughput)
from common import device_name, median, print_table, write_result

# Gemma 3 lm_head, Gemma MLP, TinyLlama MLP, SmolLM2-135M MLP up and down
SHAPES = [(262144, 640), (2048, 640), (5632, 2048), (1536, 576), (576, 1536)]
ROWS = [1, 2, 4, 5, 8, 16, 32, 64, 128]


def time_ms(fn, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * median(times)


def main() -> None:
    from mlxr.ops.half_linear.half_linear_cpu import half_linear_cpu

    rows_out = []
    for n, k in SHAPES:
        w = torch.randn(n, k) * 0.02
        wh, wb = w.half(), w.bfloat16()
        for m in ROWS:
            x = torch.randn(m, k)
            rows_out.append({
                "shape": f"{n}x{k}", "rows": m,
                "fp32_ms": time_ms(lambda: F.linear(x, w)),
                "fp16_gemv_ms": time_ms(lambda: F.linear(x.half(), wh).float()),
                "fp16_kernel_ms": time_ms(lambda: half_linear_cpu(x, wh)) if half_linear_cpu(x, wh) is not None else None,
                "fp16_upcast_ms": time_ms(lambda: F.linear(x, wh.float())),
                "bf16_ms": time_ms(lambda: F.linear(x.bfloat16(), wb).float()),
            })
    path = write_result("linear", {"device": device_name("cpu"), "results": rows_out})
    print_table(rows_out, ["shape", "rows", "fp32_ms", "fp16_gemv_ms", "fp16_kernel_ms", "fp16_upcast_ms", "bf16_ms"])
    print(path)


if __name__ == "__main__":
    main()
