"""The engine core's own host work per decode step at a large batch, with no model and no
device: the scheduler's schedule and update_from_output over N running requests with sampled
tokens made up, and the step's outputs encoded for the frontend (CoreOutputs), as the core
process does every step. On an H200 the batch-256 core landed a step every 2.0 ms, 1.6 ms of it
host work between landings (a device-only probe): this times the part that is pure Python.
JSON to bench/results/core_host_step-*.json.

  python bench/probes/core_host_step.py [--batch 256] [--steps 120] [--rounds 5] [--label L] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import time

import bench_path  # noqa: F401,I001  (bench/ on sys.path: common)
from common import median, write_result
from mlxr.engine.records import CoreOutputs, EngineCoreRequest, ModelRunnerOutput, encode
from mlxr.engine.sched.block_manager import BlockManager
from mlxr.engine.sched.request import Request
from mlxr.engine.sched.scheduler import Scheduler, SchedulerConfig
from mlxr.types import SamplingParams


def run(batch: int, steps: int, prof: cProfile.Profile | None) -> dict[str, list[float]]:
    rnd = random.Random(0)
    sched = Scheduler(SchedulerConfig(batch, 8192, 4096), BlockManager(2 * batch * 40, 16, True))
    params = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        prompt = [rnd.randrange(10, 32000) for _ in range(128)]
        sched.add(Request(EngineCoreRequest(f"r{i}", prompt, params, steps + 8, [2], time.monotonic())))
    times = {"schedule": [], "update": [], "encode": []}
    inflight = None
    for step in range(steps + 6):
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        landed = []
        if inflight is not None:  # overlap: the step before lands after this one is scheduled
            prev = inflight
            result = ModelRunnerOutput(list(prev.request_ids), [[rnd.randrange(10, 32000)] for _ in prev.request_ids])
            landed = sched.update_from_output(prev, result)
        t2 = time.perf_counter()
        wire = encode(CoreOutputs(landed, None))
        t3 = time.perf_counter()
        inflight = out
        if step >= 6 and len(out.request_ids) == batch:  # steady decode only
            times["schedule"].append(t1 - t0)
            times["update"].append(t2 - t1)
            times["encode"].append(t3 - t2)
        if prof is not None and step == 5:
            prof.enable()
        assert wire
    if prof is not None:
        prof.disable()
    return times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--label", default="", help="what tree this is (the JSON's commit is HEAD's)")
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    rounds = [run(a.batch, a.steps, None) for _ in range(a.rounds)]
    row = {k: median([1e3 * median(r[k]) for r in rounds]) for k in rounds[0]}
    row["total"] = sum(row.values())
    print(f"batch {a.batch}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in row.items()))
    if a.profile:
        prof = cProfile.Profile()
        run(a.batch, a.steps, prof)
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    write_result("core_host_step", {"label": a.label, "batch": a.batch, "steps": a.steps, "ms_a_step": row})


if __name__ == "__main__":
    main()
