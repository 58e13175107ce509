"""Where a long prompt's time to first token goes on the GPU: the TTFT loop of bench/latency.py
(add a request, step until its first token is on the host) under torch.profiler, the kernels
by device time and the host's time in each engine call. It uses only LLM, engine.add_request,
engine.step and engine.has_unfinished, so an older tree runs it too (bench/gpu/old_vs_new.sh
profile): the 2026-11-28 H200 lease measured this tree's prefill of 512 ~15% slower than
7f626b9's in both engine-process modes, cause not yet found.

  python bench/probes/prefill_profile.py --model-dir DIR [--tokens 512] [--runs 5] [--label L]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from latency import prompt_ids  # noqa: E402

from mlxr import LLM, SamplingParams  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def first_token_s(engine, rid: str, ids: list[int], max_tokens: int = 2) -> tuple[float, list[float]]:
    """Seconds to the request's first token, and the host seconds of each engine.step() call
    until then; the request is run to its end afterwards (max_tokens tokens)."""
    engine.add_request(rid, ids, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                       stream_deltas=True)
    _sync()
    t0, first, calls = time.perf_counter(), None, []
    while engine.has_unfinished():
        c0 = time.perf_counter()
        with torch.profiler.record_function("engine.step"):
            outs = engine.step()
        if first is None:
            calls.append(time.perf_counter() - c0)
            if any(o.outputs[0].token_ids for o in outs):
                first = time.perf_counter() - t0
    return first, calls


def timeline(prof, t_first_token_us: float | None = None) -> list[str]:
    """The last run as segments: each engine.step call on the host, and the device's busy spans
    (kernels less than 20 us apart merged), in microseconds from the first step call."""
    events = prof.events()
    steps = [e for e in events if e.name == "engine.step" and e.device_type == torch.autograd.DeviceType.CPU]
    kernels = sorted((e.time_range.start, e.time_range.end) for e in events
                     if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    last_steps = steps[-8:]
    t0 = last_steps[0].time_range.start
    spans: list[list[float]] = []
    for a, b in kernels:
        if a < t0 - 5000:
            continue
        if spans and a - spans[-1][1] < 20:
            spans[-1][1] = max(spans[-1][1], b)
        else:
            spans.append([a, b])
    rows = [f"host step {e.time_range.start - t0:8.0f} .. {e.time_range.end - t0:8.0f}" for e in last_steps]
    rows += [f"device busy {a - t0:8.0f} .. {b - t0:8.0f}" for a, b in spans]
    return sorted(rows, key=lambda r: float(r.split()[2]))


def host_calls(prof, min_us: float = 25.0) -> list[str]:
    """The last run's first engine.step on the host: its CUDA runtime calls and the ops taking
    min_us or more, by start (microseconds from the call's start), to see what comes before
    the device's first kernel."""
    events = prof.events()
    cpu = torch.autograd.DeviceType.CPU
    steps = [e for e in events if e.name == "engine.step" and e.device_type == cpu]
    first = steps[-3] if len(steps) >= 3 else steps[0]  # the last run: prefill, decode, final
    a, b = first.time_range.start, first.time_range.end
    rows = []
    for e in events:
        if e.device_type != cpu or not (a <= e.time_range.start <= b) or e.name == "engine.step":
            continue
        dur = e.time_range.end - e.time_range.start
        if dur >= min_us or e.name.startswith(("cudaGraphLaunch", "cudaStreamSynchronize", "cudaEventSynchronize",
                                                  "cudaMemcpy", "cudaDeviceSynchronize")):
            rows.append((e.time_range.start - a, dur, e.name[:60]))
    return [f"{t:7.0f} +{d:6.0f} {n}" for t, d, n in sorted(rows)][:80]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--label", default="")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the probe itself")
    a = ap.parse_args()
    llm = LLM(a.model_dir, dtype=torch.bfloat16 if a.device == "cuda" else torch.float32, device=a.device,
              max_num_seqs=256, max_num_batched_tokens=8192, kv_cache_memory_gb=16 if a.device == "cuda" else 1)
    engine = llm.engine
    vocab = llm.args.vocab_size if hasattr(llm, "args") else llm.loaded.args.vocab_size
    ids = prompt_ids(vocab, a.tokens)
    for i in range(2):  # warm
        first_token_s(engine, f"warm-{i}", ids[i:] + ids[:i])
    one = sorted(first_token_s(engine, f"one-{i}", ids[i:] + ids[:i], max_tokens=1)[0]
                 for i in range(50, 50 + a.runs))  # rotations of their own: no prefix-cache hits
    ttft, calls = [], []
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
    with prof:
        for i in range(2, 2 + a.runs):  # each a rotated prompt: nothing from the prefix cache
            s, c = first_token_s(engine, f"run-{i}", ids[i:] + ids[:i])
            ttft.append(s)
            calls.append(c)
    # self device time: a kernel's own, not again under the op that launched it
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    kernels = sorted(events, key=lambda e: -e.self_device_time_total)[:20]
    top = [{"name": e.key[:90], "calls": e.count, "device_us_per_run": e.self_device_time_total / a.runs}
           for e in kernels]
    ttft.sort()
    result = {"label": a.label, "tokens": a.tokens, "ttft_ms": [1e3 * t for t in ttft],
              "median_ttft_ms_max_tokens_1": 1e3 * one[len(one) // 2], "timeline_last_run": timeline(prof),
              "host_calls_prefill_step": host_calls(prof),
              "median_ttft_ms": 1e3 * ttft[len(ttft) // 2], "prefill_tok_s": a.tokens / ttft[len(ttft) // 2],
              "step_calls_host_ms": [[round(1e3 * x, 3) for x in c] for c in calls],
              "device_us_per_run": sum(e.self_device_time_total for e in events) / a.runs, "top": top}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
