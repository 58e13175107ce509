"""A constrained step's sampling waits for its rows' grammar masks, and a mask needs the step
before it landed (its matchers take that step's tokens). The engine core runs such a step in
one of two ways: the runner calls mask_hook between the forward it queued and the sampling, or,
under overlap with no drafts, forward_ahead queues the forward one engine call ahead and
launch_sampling samples it in the next. Plain functions of the core, which owns the step and
its state: the step in flight (core._inflight) and the forwarded one (core._forwarded)."""
from __future__ import annotations

from mlxr.engine.worker.model_runner import BeforeSample, Forwarded
from mlxr.engine.records import EngineCoreOutput, SchedulerOutput


def forward_ahead(core, out: SchedulerOutput) -> list[EngineCoreOutput]:
    """A constrained step under overlap: its forward is queued, then the step in flight lands
    (its sampling ran before this forward on the device) and this step's masks start filling;
    the next call schedules, samples under them and queues the next forward at once. So the
    device runs a forward while the host lands, and the masks fill (on the manager's worker,
    for a large batch) while the host hands the outputs on, takes new requests and schedules,
    rather than the device idling from sampling to the next forward."""
    try:
        if core.tiers is not None:
            core.tiers.flush()
        fwd = core.runner.forward(out)
    except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the engine
        return core._failed_launch(out, e)
    landed = core._land_and_flush(core._take_inflight())
    requests = core.scheduler.requests
    try:
        core._forwarded = (out, fwd, core.structured.bitmask([requests.get(rid) for rid in fwd.request_ids]))
    except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the engine
        return landed + core.fail_step(out.request_ids, e)
    return landed


def launch_sampling(core, out: SchedulerOutput, fwd: Forwarded, bitmask) -> list[EngineCoreOutput]:
    """Queue a forwarded step's sampling. Scheduling the next step may come first (it only
    decides; the runner's batch changes at the next forward), so the host schedules while the
    device still runs this step's forward."""
    try:
        core._inflight = (out, core.runner.sample(fwd, bitmask))
    except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the engine
        core.structured.settle()
        return core.fail_step(out.request_ids, e)
    return []


def mask_hook(core, landed: list[EngineCoreOutput]) -> BeforeSample:
    """Called by the runner between a step's forward (queued) and its sampling: lands the
    previous step, whose tokens the matchers need, into landed and returns the rows' bitmask
    (perhaps pending: the sampler waits for it)."""
    def before_sample(request_ids: list[str], drafts: dict[str, list[int]]):
        landed.extend(core._land(core._take_inflight()))
        requests = core.scheduler.requests
        rows = [requests.get(rid) for rid in request_ids]
        if drafts:
            return core.structured.position_bitmask(rows, [drafts.get(rid, []) for rid in request_ids])
        return core.structured.bitmask(rows)
    return before_sample
