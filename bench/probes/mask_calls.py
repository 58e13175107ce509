"""Where a constrained batch's host time goes, call by call: bench/structured_overhead.py's schema
arm (batch 1, 8, then --batch, as the bench orders them, so the choosers' trials fall where they
do there), with the structured manager's pieces wrapped and each call's time kept: the bitmask
(its scan, buffer, fill hand-off), where the fill ran, the worker's start, the sampler's wait for
it, the matchers' landed tokens, and sampling. Percentiles per piece, so a piece that is slow
once in a while (a trial fill on the step thread) shows apart from one slow every step. JSON to
bench/results/<day>/mask_calls-*.json.

  python bench/probes/mask_calls.py --device cuda --batch 64 --reps 3
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import bench_path  # noqa: F401,I001  (bench/ on sys.path)
from common import device_name, print_table, write_result
from structured_overhead import cpu_model, run_arm
from mlxr import LLM


def percentiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    if not xs:
        return {"calls": 0}
    at = lambda q: 1e3 * xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return {"calls": len(xs), "total_ms": 1e3 * sum(xs), "p10": at(0.1), "p50": at(0.5), "p90": at(0.9),
            "p99": at(0.99), "max": 1e3 * xs[-1]}


def wrap(obj, name: str, key: str, times: dict, on: list, undo: list) -> None:
    """obj.name timed into times[key] while on[0]; undo gets what puts it back (as
    step_phases.time_phases does: an attribute of obj's own is set back, a looked-up one removed)."""
    fn = getattr(obj, name)
    own = name in getattr(obj, "__dict__", {})
    saved = obj.__dict__.get(name) if own else None

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if on[0]:
                times[key].append(time.perf_counter() - t0)
    setattr(obj, name, timed)
    undo.append(lambda: setattr(obj, name, saved) if own else delattr(obj, name))


def instrument(llm, times: dict, picks: dict, on: list) -> list:
    """Wraps the step's pieces; returns the undo list (call its items in reverse to unwrap)."""
    from mlxr.engine.structured import mask_job, matcher

    core = llm.engine.core.core
    manager = core.structured
    undo: list = []
    flight = core.in_flight
    for obj, name, key in [(flight, "forward_ahead", "forward_ahead"),
                           (flight, "sample_forwarded", "launch_sampling"), (core, "step", "core_step"),
                           (flight, "land", "land"), (core.scheduler, "schedule", "schedule"),
                           (manager, "admit", "admit"), (llm.engine.output, "process", "detokenize"),
                           (manager, "bitmask", "bitmask"), (manager, "_fill", "fill_call"),
                           (manager._worker, "start", "worker_start"), (manager._buffers, "take", "buffers_take"),
                           (core.scheduler, "update_from_output", "update"), (matcher, "advance_all", "advance_all"),
                           (core.runner.sampler, "launch", "sample"), (mask_job.PendingMask, "__call__", "pending_wait"),
                           (llm.engine, "step", "step")]:
        wrap(obj, name, key, times, on, undo)
    choose = manager._where.choose

    def counted(rows: int) -> str:
        kind = choose(rows)
        if on[0]:
            picks[f"{kind}@{rows}"] += 1
        return kind
    manager._where.choose = counted
    undo.append(lambda: delattr(manager._where, "choose"))
    return undo


WAYS = [("worker", "parallel", "parallel"), ("worker", "parallel", "serial"), ("worker", "serial", "serial"),
        ("step_thread", "parallel", "serial"), ("step_thread", "serial", "serial"),
        ("step_thread", "parallel", "parallel")]


def compare_ways(llm, batch: int, gen_len: int, reps: int) -> list[dict]:
    """tok/s of each fixed (where the fill runs, fill kind, token-update kind), the choosers
    bypassed, beside the plain arm run just before each schema run."""
    from mlxr.engine.structured import matcher

    manager = llm.engine.core.core.structured
    choosers = (manager._where, manager.filler._chooser, matcher._shared["chooser"])
    saved = [c.choose for c in choosers]
    rows = []
    try:
        for way in WAYS:
            for chooser, kind in zip(choosers, way):
                chooser.choose = lambda rows, _k=kind: _k
            plain, schema = [], []
            for _ in range(reps):
                plain.append(run_arm(llm, batch, gen_len, False)[0])
                schema.append(run_arm(llm, batch, gen_len, True)[0])
            rows.append({"where": way[0], "fill": way[1], "consume": way[2], "plain": sorted(plain)[len(plain) // 2],
                         "schema": sorted(schema)[len(schema) // 2]})
            rows[-1]["ratio"] = rows[-1]["schema"] / rows[-1]["plain"]
    finally:
        for chooser, choose in zip(choosers, saved):
            chooser.choose = choose
    print_table(rows, ["where", "fill", "consume", "plain", "schema", "ratio"])
    return rows


def own_ms(stats, steps: int) -> dict[str, float]:
    return {f"{f[0].rsplit('/', 2)[-1]}:{f[1]}:{f[2]}": 1e3 * v[2] / steps for f, v in stats.stats.items()}


def profile_arms(llm, batch: int, gen_len: int, top: int) -> list[dict]:
    """One rep of each arm under cProfile (the step thread: this one): own time a step of the
    functions that differ most, schema minus plain."""
    import cProfile
    import pstats

    own = {}
    for constrained in (False, True):
        prof = cProfile.Profile()
        prof.enable()
        run_arm(llm, batch, gen_len, constrained)
        prof.disable()
        own[constrained] = own_ms(pstats.Stats(prof), gen_len)
    keys = set(own[False]) | set(own[True])
    rows = [{"fn": k, "plain": own[False].get(k, 0.0), "schema": own[True].get(k, 0.0)} for k in keys]
    for r in rows:
        r["diff"] = r["schema"] - r["plain"]
    rows.sort(key=lambda r: -abs(r["diff"]))
    print_table(rows[:top], ["fn", "plain", "schema", "diff"])
    print("total own ms a step: plain %.2f schema %.2f" % (sum(own[False].values()), sum(own[True].values())))
    return rows[:top]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=96)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--label", default="")
    ap.add_argument("--ways", action="store_true", help="then each fixed way of running the grammar work "
                    "(where the fill runs, serial or parallel fills and token updates), plain and schema arms "
                    "interleaved, instead of the choosers")
    ap.add_argument("--profile", type=int, default=0, help="then one rep of each arm under cProfile: the N functions "
                    "whose own time differs most between them, ms a step")
    a = ap.parse_args()
    llm = LLM(a.model, device=a.device, engine_process=False, max_num_seqs=max(64, a.batch))
    for batch in (1, 8, a.batch):  # the bench's order: the choosers' trials happen on the way
        run_arm(llm, batch, a.gen_len, False), run_arm(llm, batch, a.gen_len, True)
    times, picks, on = defaultdict(list), defaultdict(int), [False]
    undo = instrument(llm, times, picks, on)
    runs = []
    on[0] = True
    for _ in range(a.reps):
        runs.append(run_arm(llm, a.batch, a.gen_len, True)[0])
    on[0] = False
    steps = max(1, len(times["step"]))
    rows = [{"piece": k, **percentiles(v), "ms_per_step": 1e3 * sum(v) / steps} for k, v in sorted(times.items())]
    print_table(rows, ["piece", "calls", "ms_per_step", "p10", "p50", "p90", "p99", "max"])
    print("where the fills ran:", dict(picks), "tok/s:", [round(r) for r in runs])
    for put_back in reversed(undo):  # the runs below time themselves, without the wrappers
        put_back()
    ways = compare_ways(llm, a.batch, a.gen_len, a.reps) if a.ways else []
    diff = profile_arms(llm, a.batch, a.gen_len, a.profile) if a.profile else []
    print(write_result("mask_calls", {"profile_ms_per_step": diff, "ways": ways, "label": a.label, "model": a.model,
                                      "device": device_name(a.device), "cpu": cpu_model(), "batch": a.batch, "gen_len": a.gen_len, "reps": a.reps,
                                      "tok_s": runs, "picks": dict(picks), "pieces_ms": rows}))


if __name__ == "__main__":
    main()
