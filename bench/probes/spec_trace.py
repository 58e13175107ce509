"""Where the device idles in a batch-1 n-gram speculating run: one task's generation under
torch.profiler (host ops, Python functions and device kernels), then the device's idle gaps
and the host functions that ran inside them. Summary printed and written as JSON; the chrome
trace is kept gzipped beside it.

  python bench/probes/spec_trace.py --device cuda [--k 8] [--task 0] [--off]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import device_name, write_result  # noqa: E402
from bench.spec_decode import TASKS, chat_ids, timed  # noqa: E402
from mlxr import LLM  # noqa: E402
from mlxr.bundled_models import smollm2_135m_path  # noqa: E402

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def device_intervals(events: list[dict]) -> list[tuple[float, float]]:
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") in DEVICE_CATS)
    merged: list[list[float]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def gaps_of(busy: list[tuple[float, float]], min_us: float) -> list[tuple[float, float]]:
    return [(a[1], b[0]) for a, b in zip(busy, busy[1:]) if b[0] - a[1] >= min_us]


def host_in_gaps(events: list[dict], gaps: list[tuple[float, float]]) -> dict[str, float]:
    """Microseconds of each host event's span that fall inside device idle gaps (an event's
    nested children count too: read it as inclusive time)."""
    out: dict[str, float] = defaultdict(float)
    host = [e for e in events if e.get("cat") in ("python_function", "cpu_op", "cuda_runtime") and "dur" in e]
    for e in host:
        s, t = e["ts"], e["ts"] + e["dur"]
        for g0, g1 in gaps:
            lo, hi = max(s, g0), min(t, g1)
            if hi > lo:
                out[e["name"][:120]] += hi - lo
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--task", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--off", action="store_true")
    ap.add_argument("--min-gap-us", type=float, default=10.0)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    llm = LLM(str(smollm2_135m_path()), device=args.device, speculative_method="ngram",
              num_speculative_tokens=args.k, engine_process=False)
    ids = [chat_ids(llm.tokenizer, t) for t in TASKS]
    for _ in range(2):
        timed(llm, [ids[args.task]], args.max_tokens, not args.off)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, with_stack=True) as prof:
        dt, n, _ = timed(llm, [ids[args.task]], args.max_tokens, not args.off)
    path = Path(tempfile.mkdtemp()) / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    busy = device_intervals(events)
    gaps = gaps_of(busy, args.min_gap_us)
    if not busy:
        sys.exit("no device events in the trace: this probe needs a CUDA device")
    span = busy[-1][1] - busy[0][0]
    idle = sum(b - a for a, b in gaps)
    ranked = sorted(host_in_gaps(events, gaps).items(), key=lambda kv: -kv[1])[: args.top]
    gap_sizes = sorted(b - a for a, b in gaps)
    summary = {
        "device": device_name(args.device), "k": args.k, "task": args.task, "speculative": not args.off,
        "tokens": n, "seconds_profiled": dt, "device_span_us": span, "device_busy_us": sum(e - s for s, e in busy),
        "idle_gaps": len(gaps), "idle_us": idle, "idle_per_token_us": idle / max(n, 1),
        "gap_us_p50": gap_sizes[len(gap_sizes) // 2] if gaps else 0, "gap_us_max": gap_sizes[-1] if gaps else 0,
        "host_us_inside_gaps": ranked,
    }
    print(json.dumps(summary, indent=1))
    out = write_result("spec_trace", summary)
    with gzip.open(str(out).replace(".json", ".trace.json.gz"), "wt") as f:
        json.dump(events, f)
    os.remove(path)


if __name__ == "__main__":
    main()
