"""The host's cost of launching a captured decode graph (cudaGraphLaunch through
CUDAGraph.replay) with the device idle before it, by padded batch size, beside the graph's
device time: at batch 1 a speculating step's launch sits on its critical path (the device
waits for the host), where a plain step's is hidden behind the step before it. The bundled
SmolLM2 Q4_1; --gemv-max-m moves the Q4_1 GEMV's row limit (quant/extra_triton.GEMV_MAX_M).
Found (H100, graph_launch-20261125T100751Z): 5-25 us a launch, against 2.0-2.9 ms of replay.

  python bench/probes/graph_launch.py [--reps 50] [--gemv-max-m M]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import device_name, median, write_result  # noqa: E402
from mlxr import LLM  # noqa: E402
from mlxr.bundled_models import smollm2_135m_path  # noqa: E402


def launch_times(graph: torch.cuda.CUDAGraph, reps: int) -> tuple[float, float]:
    """(median host us of replay() from an idle device, median device us of one replay)."""
    host, device = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        graph.replay()
        host.append((time.perf_counter() - t0) * 1e6)
        end.record()
        torch.cuda.synchronize()
        device.append(start.elapsed_time(end) * 1e3)
    return median(host), median(device)


def kernel_times(graph: torch.cuda.CUDAGraph, reps: int, top: int) -> list[tuple[str, float, int]]:
    """(kernel name, device us per replay, launches per replay) of the graph's largest kernels,
    from torch.profiler's device records over reps replays."""
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / reps, e.count // reps) for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[1])[:top]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 5, 9, 16, 64])
    ap.add_argument("--gemv-max-m", type=int, default=None,
                    help="extra_triton.GEMV_MAX_M for this run (rows above it dequantize + cuBLAS)")
    ap.add_argument("--kernels", type=int, default=0, help="also list this many largest kernels per size")
    args = ap.parse_args()
    if args.gemv_max_m is not None:
        from mlxr.ops.quant import extra_triton

        extra_triton.GEMV_MAX_M = args.gemv_max_m
    llm = LLM(str(smollm2_135m_path()), device="cuda", engine_process=False)
    graphs = llm.engine.core.core.runner.graphs
    rows = []
    for b in args.sizes:
        if b not in graphs.graphs:
            continue
        graph, _ = graphs.graphs[b]
        host_us, device_us = launch_times(graph, args.reps)
        row = {"rows": b, "launch_host_us": host_us, "replay_device_us": device_us}
        print(f"{b:4d} rows: launch {host_us:7.1f} us host, replay {device_us:7.1f} us device")
        if args.kernels:
            row["kernels"] = kernel_times(graph, 10, args.kernels)
            for name, us, count in row["kernels"]:
                print(f"      {us:8.1f} us  x{count:<4d} {name[:110]}")
        rows.append(row)
    write_result("graph_launch", {"device": device_name("cuda"), "model": "smollm2:135m", "reps": args.reps,
                                  "gemv_max_m": args.gemv_max_m, "rows": rows})


if __name__ == "__main__":
    main()
