"""Why batched decode steps cost what they cost: a B-sequence run (prompt 128, gen 128) timed
per step, with the host's phases and the GPU's kernel time measured in an early and a late
window of the decode, at two KV-cache sizes. JSON to bench/results/step_windows-*.json.

  python bench/probes/step_windows.py [--batches 64 256] [--kv-gb 8 16]
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

import torch

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, throughput)
from common import device_name, median, print_table, sync, time_engine_phases, write_result
from latency import model_paths
from throughput import workload

def gpu_ms_per_step(prof, steps: int) -> float:
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in kernels) / 1e3 / steps


def run(llm, batch: int, windows: list[tuple[int, int]]) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from mlxr import SamplingParams

    engine, spent = llm.engine, Counter()
    vocab = llm.args.vocab_size
    for i, (ids, n) in enumerate(workload(vocab, batch, 128, 128, False, seed=7)):
        engine.add_request(f"w-{i}", ids, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), stream_deltas=True)
    sch = engine.core.core.scheduler
    while sch.waiting or any(s.num_uncomputed_tokens > 1 for s in sch.running):
        engine.step()
    unwrap = time_engine_phases(engine, spent)
    out, times, k = {}, [], 0
    try:
        while engine.has_unfinished():
            window = next((w for w in windows if w[0] == k), None)
            if window is not None:
                sync(engine.core.core.runner.device.type)
                spent.clear()
                prof = profile(activities=[ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU])
                prof.__enter__()
                t0 = time.perf_counter()
            t = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t)
            k += 1
            end = next((w for w in windows if w[1] == k), None)
            if end is not None:
                wall = time.perf_counter() - t0
                prof.__exit__(None, None, None)
                n = end[1] - end[0]
                out[f"steps_{end[0]}_{end[1]}"] = {"wall_ms": 1e3 * wall / n, "gpu_kernel_ms": gpu_ms_per_step(prof, n),
                                                  **{p: 1e3 * v / n for p, v in spent.items()}}
    finally:
        unwrap()
    out["step_ms_p50_all"] = 1e3 * median(times)
    out["step_ms_first10"] = [round(1e3 * t, 2) for t in times[:10]]
    out["step_ms_last10"] = [round(1e3 * t, 2) for t in times[-10:]]
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    p.add_argument("--kv-gb", type=float, nargs="+", default=[8, 16])
    p.add_argument("--model", default="tinyllama-shape")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    from mlxr import LLM
    from throughput import run_mlxr

    rows, detail = [], {}
    for kv in a.kv_gb:
        llm = LLM(model_paths(a.model)[0], dtype=torch.bfloat16 if a.device == "cuda" else None, device=a.device, engine_process=False, max_num_seqs=256,
                  max_num_batched_tokens=8192, kv_cache_memory_gb=kv)
        vocab = llm.args.vocab_size
        run_mlxr(llm, workload(vocab, 2, 16, 4, False), a.device)
        for b in a.batches:
            tput = run_mlxr(llm, workload(vocab, b, 128, 128, False, seed=3), a.device)
            d = run(llm, b, [(5, 25), (95, 115)])
            detail[f"kv{kv} b{b}"] = d
            rows.append({"kv_gb": kv, "batch": b, "decode_tok_s": tput["decode_tok_s"], "step_p50": tput["decode_step_ms_p50"],
                         **{f"{w}:{k}": round(v, 2) for w in ("steps_5_25", "steps_95_115")
                            for k, v in d[w].items() if k in ("wall_ms", "gpu_kernel_ms", "land", "execute")}})
        del llm
        if a.device == "cuda":
            torch.cuda.empty_cache()
    path = write_result("step_windows", {"model": a.model, "dtype": "bfloat16", "device": device_name(a.device),
                                         "results": rows, "detail": detail})
    for k, d in detail.items():
        print(k, d)
    print_table(rows, list(rows[0]))
    print(path)


if __name__ == "__main__":
    main()
