"""The steps the engine core queued on the device and has not landed: the one owner of them.

At most two: the step launched last (its sampled tokens still on the device; it lands while
the device runs the next one, under overlap) and a constrained step forwarded ahead (its
forward queued, its sampling waiting for its rows' grammar masks).

A constrained step's sampling waits for its rows' masks, and a mask needs the step before it
landed (its matchers take that step's tokens). So such a step runs in one of two ways: the
runner calls a mask hook between the forward it queued and the sampling, or, under overlap
with no drafts, forward_ahead queues the forward one engine call ahead and sample_forwarded
samples it in the next."""
from __future__ import annotations

from mlxr.engine.records import EngineCoreOutput, SchedulerOutput
from mlxr.engine.worker.model_runner import BeforeSample, Forwarded, RunnerStep


class StepsInFlight:
    """core: the engine core whose runner, scheduler, structured manager and tiers the steps
    run on (read at each call: the core replaces its scheduler when it resets)."""

    def __init__(self, core) -> None:
        self._core = core
        self._launched: tuple[SchedulerOutput, RunnerStep] | None = None
        # A constrained step queued up to its sampling: its forward, and its rows' mask
        # (perhaps still filling on the structured manager's worker).
        self._forwarded: tuple[SchedulerOutput, Forwarded, object] | None = None

    @property
    def empty(self) -> bool:
        return self._launched is None and self._forwarded is None

    @property
    def launched(self) -> SchedulerOutput | None:
        """The schedule of the step launched and not landed, if any."""
        return self._launched[0] if self._launched is not None else None

    @property
    def forwarded(self) -> bool:
        """Whether a constrained step waits for its sampling (sample_forwarded queues it)."""
        return self._forwarded is not None

    # --- launching -----------------------------------------------------------------------------
    def execute(self, out: SchedulerOutput, draft_probs: dict | None) -> list[EngineCoreOutput]:
        """Queue a scheduled step (forward and sampling) and land the one before it; without
        overlap the step lands at once too. A constrained step under overlap with no drafts
        is forwarded ahead instead."""
        core = self._core
        constrained = core.structured.constrains(out.request_ids)
        if constrained and core.overlap and not out.spec_token_ids:
            return self.forward_ahead(out)
        landed: list[EngineCoreOutput] = []
        hook = self._mask_hook(landed) if constrained else None
        try:
            self._flush_tiers()  # blocks evicted or loaded while scheduling move before the forward
            launched = core.runner.execute(out, hook, draft_probs)
        except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the engine
            core.structured.settle()
            return landed + self._failed_launch(out, e)
        outputs = landed + self.land_and_flush()
        self._launched = (out, launched)
        if not core.overlap:
            outputs += self.land_and_flush()
        return outputs

    def forward_ahead(self, out: SchedulerOutput) -> list[EngineCoreOutput]:
        """A constrained step under overlap: its forward is queued, then the step in flight lands
        (its sampling ran before this forward on the device) and this step's masks start filling;
        the next call schedules, samples under them and queues the next forward at once. So the
        device runs a forward while the host lands, and the masks fill (on the manager's worker,
        for a large batch) while the host hands the outputs on, takes new requests and schedules,
        rather than the device idling from sampling to the next forward."""
        core = self._core
        try:
            self._flush_tiers()
            fwd = core.runner.forward(out)
        except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the engine
            return self._failed_launch(out, e)
        landed = self.land_and_flush()
        requests = core.scheduler.requests
        try:
            self._forwarded = (out, fwd, core.structured.bitmask([requests.get(rid) for rid in fwd.request_ids]))
        except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the engine
            return landed + core.fail_step(out.request_ids, e)
        return landed

    def sample_forwarded(self) -> list[EngineCoreOutput]:
        """Queue the forwarded step's sampling, if one waits. Scheduling the next step may come
        first (it only decides; the runner's batch changes at the next forward), so the host
        schedules while the device still runs this step's forward."""
        if self._forwarded is None:
            return []
        (out, fwd, bitmask), self._forwarded = self._forwarded, None
        core = self._core
        try:
            self._launched = (out, core.runner.sample(fwd, bitmask))
        except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the engine
            core.structured.settle()
            return core.fail_step(out.request_ids, e)
        return []

    def _mask_hook(self, landed: list[EngineCoreOutput]) -> BeforeSample:
        """Called by the runner between a step's forward (queued) and its sampling: lands the
        previous step, whose tokens the matchers need, into landed and returns the rows' bitmask
        (perhaps pending: the sampler waits for it)."""
        def before_sample(request_ids: list[str], drafts: dict[str, list[int]]):
            landed.extend(self.land())
            core = self._core
            requests = core.scheduler.requests
            rows = [requests.get(rid) for rid in request_ids]
            if drafts:
                return core.structured.position_bitmask(rows, [drafts.get(rid, []) for rid in request_ids])
            return core.structured.bitmask(rows)
        return before_sample

    def _failed_launch(self, out: SchedulerOutput, e: Exception) -> list[EngineCoreOutput]:
        """A step whose launch raised (called in its except block): the step in flight lands
        (counting only what it computed), then this step's requests fail."""
        scheduler = self._core.scheduler
        scheduler.unrun(out)
        outputs = self.land()
        scheduler.recompute_swapped(out.preempted_request_ids)  # their swap-out may not have run
        return outputs + self._core.fail_step(out.request_ids, e)

    # --- landing -------------------------------------------------------------------------------
    def land(self) -> list[EngineCoreOutput]:
        """Wait for the launched step's tokens, if one is in flight, and take them in."""
        if self._launched is None:
            return []
        (out, launched), self._launched = self._launched, None
        core = self._core
        try:
            result = launched.result()
        except Exception as e:  # noqa: BLE001 - as a failed launch
            return core.fail_step(out.request_ids, e)
        try:
            if out.spec_token_ids and core.speculator is not None:
                core.speculator.observe(out, result)
            return core.scheduler.update_from_output(out, result)
        except Exception as e:  # noqa: BLE001 - a bug taking in a step fails that step's requests, not the core
            return core.fail_step(out.request_ids, e, "landing a step failed")

    def land_and_flush(self) -> list[EngineCoreOutput]:
        """As land; then the blocks the step completed go to disk now, not at the next step."""
        outputs = self.land()
        self._flush_tiers()
        return outputs

    def _flush_tiers(self) -> None:
        if self._core.tiers is not None:
            self._core.tiers.flush()
