"""An engine step's host time by phase, for benches that drive an in-process LLM: schedule,
forward (inputs built and the forward queued; on a CPU, run), wait (the host blocked on the
device for a step's tokens), update (the scheduler taking them in, grammar matchers included),
mask_fill (structured output's bitmask on the step thread: the rows' scan, and the fill itself
unless a worker thread runs it; a drafting step's masks per position), sample (sampling queued,
the mask's copy and apply included), propose (drafts: a proposer's, a grammar's forced tokens),
verify (a drafting step's rejection sampling, its masks' apply included),
detokenize (the frontend), and the rest of the step. Nested phases, parts of the ones above:
forward_inputs (the forward's index arrays), forward_graph (a steady decode step's CUDA graph:
its inputs' copies and replay), consume (grammar matchers taking landed tokens,
in update), mask_wait (sample waiting for a worker's fill) and mask_apply (in sample). Each
phase's number of calls is recorded too (on CUDA, forwards beyond forward_graph's ran eagerly)."""
from __future__ import annotations

import contextlib
import os
import time
from collections import Counter

PHASES = ("schedule", "forward", "forward_inputs", "forward_graph", "wait", "update", "consume", "mask_fill", "sample",
          "mask_wait", "mask_apply", "propose", "verify", "detokenize")
_NESTED = {"forward_inputs", "forward_graph", "consume", "mask_wait", "mask_apply"}
CONSUME = ("advance_all",)  # mlxr.engine.structured.matcher's batch of landed tokens


def _targets(llm) -> list[tuple[object, str, str]]:
    from mlxr.engine.worker.input_batch import InputBatch
    from mlxr.engine.worker.model_runner import RunnerStep
    from mlxr.engine.worker.sampler import ops
    from mlxr.engine.structured import matcher

    engine = llm.engine
    core = engine.core.core
    return [(engine, "step", "step"), (core.scheduler, "schedule", "schedule"),
            (core.runner, "_forward_step", "forward"), (InputBatch, "build", "forward_inputs"),
            *([(core.runner.graphs, name, "forward_graph") for name in ("run", "run_steady")]
              if core.runner.graphs is not None else []),
            (RunnerStep, "result", "wait"), (core.scheduler, "update_from_output", "update"),
            *[(matcher, name, "consume") for name in CONSUME if hasattr(matcher, name)],
            (core.structured, "bitmask", "mask_fill"), (core.structured, "position_bitmask", "mask_fill"),
            (core.runner.sampler, "launch", "sample"), (core.runner.rejection, "verify", "verify"),
            *([(core.speculator, "propose", "propose")] if core.speculator is not None else []),
            (ops, "apply_token_bitmask_", "mask_apply"), (engine.output, "process", "detokenize")]


@contextlib.contextmanager
def time_phases(llm, spent: dict):
    """Adds each phase's seconds (and the step count, "steps") to spent while in the block."""
    counts = Counter(spent)
    waited_before = getattr(llm.engine.core.core.structured.timing, "waited", 0.0)
    saved = []
    for obj, name, key in _targets(llm):
        fn = obj.__dict__.get(name, getattr(obj, name))
        saved.append((obj, name, name in obj.__dict__, fn))

        def wrapper(*args, _fn=getattr(obj, name), _key=key, **kwargs):
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                counts[_key] += time.perf_counter() - t0
                counts["calls:" + _key] += 1
                if _key == "step":
                    counts["steps"] += 1
        setattr(obj, name, wrapper)
    try:
        yield
    finally:
        for obj, name, own, fn in saved:
            if own:
                setattr(obj, name, fn)
            else:
                delattr(obj, name)
        counts["mask_wait"] += getattr(llm.engine.core.core.structured.timing, "waited", 0.0) - waited_before
        spent.clear()
        spent.update(counts)


def per_step(spent: dict) -> dict:
    """Milliseconds per engine step of each phase, and "rest": the step's time in none of them."""
    steps = max(1, spent.get("steps", 0))
    ms = {p: 1e3 * spent.get(p, 0.0) / steps for p in PHASES}
    step = 1e3 * spent.get("step", 0.0) / steps
    ms["rest"] = step - sum(v for p, v in ms.items() if p not in _NESTED)
    # How often each ran: a forward without forward_graph ran eagerly (a prefill or mixed step).
    calls = {p: spent.get("calls:" + p, 0) for p in PHASES}
    return {"steps": spent.get("steps", 0), "step": step, **ms, "calls": calls}


def host_facts() -> dict:
    """What decides how many threads can fill masks: the CPUs this process may run on, and a
    cgroup CPU quota if one is set (llguidance's executor takes 80% of what Rust sees, at most 32)."""
    facts = {"cpus_affinity": len(os.sched_getaffinity(0)), "cpus_total": os.cpu_count(),
             "grammar_threads_env": os.environ.get("MLXR_GRAMMAR_THREADS")}
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            facts["cgroup_cpu_max"] = f.read().strip()
    except OSError:
        pass
    return facts
