"""The host's work per decode step at a large batch, phase by phase, on any machine: a model
with the TinyLlama shape's vocabulary and tokenizer but almost no compute, B sequences
decoding with overlapped steps, each phase timed over 100 steps, the median of several runs.
JSON to bench/results/host_phases-*.json.

  python bench/probes/host_phases.py [--batch 256] [--runs 3]
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common, latency, throughput)
from common import device_name, median, print_table, time_engine_phases, write_result
from throughput import workload

PHASES = ("schedule", "prepare", "execute", "launch", "land", "update", "detokenize")


def run_once(llm, batch: int, steps: int, seed: int) -> dict:
    from mlxr import SamplingParams

    engine, spent = llm.engine, Counter()
    for i, (ids, n) in enumerate(workload(32000, batch, 128, steps + 16, False, seed=seed)):
        engine.add_request(f"h{seed}-{i}", ids, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
                           stream_deltas=True)
    sch = engine.core.core.scheduler
    while sch.waiting or any(s.num_uncomputed_tokens > 1 for s in sch.running):
        engine.step()
    unwrap = time_engine_phases(engine, spent)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    wall = time.perf_counter() - t0
    unwrap()
    while engine.has_unfinished():
        engine.step()
    return {"step": 1e3 * wall / steps, **{p: 1e3 * spent[p] / steps for p in PHASES}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=100)
    a = p.parse_args()
    from mlxr import LLM
    from mlxr.testing.fixtures import fixture_paths

    llm = LLM(str(fixture_paths("tinyllama-vocab").hf_dir), device="cpu", max_num_seqs=a.batch,
              max_num_batched_tokens=8192, kv_cache_memory_gb=0.25, overlap_steps=True)
    run_once(llm, 8, 8, seed=99)  # warm-up
    runs = [run_once(llm, a.batch, a.steps, seed=r) for r in range(a.runs)]
    row = {"batch": a.batch, **{k: median([r[k] for r in runs]) for k in runs[0]}}
    # execute includes prepare, and on CPU the model and the sampler's work (not host overhead).
    path = write_result("host_phases", {"model": "tinyllama-vocab", "device": device_name("cpu"), "steps": a.steps,
                                        "runs": runs, "median_ms": row})
    print_table([row], list(row))
    print(path)


if __name__ == "__main__":
    main()
