"""Token-budget scheduler: decode rows first, then prefill chunks sharing the rest of the step
fairly (budget.py: the step sized from the device's measured speed, the prefill part split
max-min fair by priority, so a short prompt never waits behind a long one's chunks); admission
in priority order, then first come first served; preemption (swap or recompute) when KV
blocks run out. It owns the requests' lives: it
decides when one finishes (stop token, EOS, max_tokens) and frees its blocks. Pure Python.

A step is scheduled before the previous one has landed (overlap): a request whose step
samples gets one more token in flight, and the next step may compute that token as its
input before its value is known on the host (the runner reads it on the device)."""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from mlxr.engine.sched.block_manager import BlockManager, SwapSpace
from mlxr.engine.sched.budget import StepSpeed, prefill_budget, prefill_shares
from mlxr.engine.sched.preemption import next_victim, unschedule
from mlxr.engine.records import (
    EngineCoreOutput, ModelRunnerOutput, NewRequestData, SchedulerOutput, TokenLogprob,
)
from mlxr.engine.sched.request import Request, RequestStatus, adapter_fits
from mlxr.engine.sched.state_prefix import StatePrefix


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    # A step's target time (budget.StepSpeed): its tokens follow the measured speed; 0: every
    # step may take max_num_batched_tokens.
    step_time_target_s: float = 0.0
    # LoRA adapters a batch may mix at most (the runner's resident slots); 0: no adapters.
    max_loras: int = 0


@dataclass
class SchedulerCounters:
    num_preemptions: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, block_manager: BlockManager, swap: SwapSpace | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.speed = StepSpeed(config.step_time_target_s, clock)
        self.blocks = block_manager
        self.swap = swap
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.swapped: deque[Request] = deque()
        self.running: list[Request] = []
        self.counters = SchedulerCounters()
        self._finished_ids: list[str] = []  # for the runner, in the next step
        self._first_scheduled: list[Request] = []  # to report once their step lands
        self._shares: dict[Request, int] = {}  # this step's prefill tokens per request
        self.state_prefix: StatePrefix | None = None  # hybrid models' prefix caching

    # --- membership --------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self.requests[req.request_id] = req
        waiting = self.waiting
        if waiting and req.priority < waiting[-1].priority:  # lower values first, as vLLM
            waiting.insert(next(i for i, r in enumerate(waiting) if r.priority > req.priority), req)
        else:
            waiting.append(req)

    def finish(self, req: Request, reason: str) -> None:
        """Mark req finished (from any state), free its blocks and forget it."""
        if req.is_finished:
            return
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        elif req.status is RequestStatus.SWAPPED:
            self.swapped.remove(req)
            self.swap.free(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = req.finish_reason or reason
        self.blocks.free(req)
        if self.state_prefix is not None:
            self.state_prefix.forget(req)
        self.requests.pop(req.request_id, None)
        if req.runner_knows:
            self._finished_ids.append(req.request_id)
            req.runner_knows = False

    def abort(self, request_ids: list[str], reason: str = "abort") -> list[Request]:
        """Finish the given live requests; returns those that were live."""
        found = [self.requests[rid] for rid in request_ids if rid in self.requests]
        for req in found:
            self.finish(req, reason)
        return found

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # --- one step ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(request_ids=[], num_scheduled_tokens=[], num_computed_tokens=[],
                              new_requests=[], new_block_ids={}, replaced_block_tables={},
                              preempted_request_ids=[], blocks_to_copy=[], blocks_to_swap_out=[],
                              blocks_to_swap_in=[], spec_token_ids={}, state_restores=[], state_saves=[], state_swap_outs=[])
        scheduled: list[tuple[Request, int]] = []
        budget = self.config.max_num_batched_tokens
        self._shares = self._prefill_shares(budget)
        budget = self._schedule_running(out, scheduled, budget)
        if not out.preempted_request_ids:
            budget = self._schedule_swapped(out, scheduled, budget)
        if not out.preempted_request_ids and not self.swapped:
            self._schedule_waiting(out, scheduled, budget)
        self._after_schedule(out, scheduled)
        self.speed.launched(out, out.num_batched_tokens)
        return out

    def _prefill_shares(self, cap: int) -> dict[Request, int]:
        """This step's prefill tokens for each running prompt, swapped request and waiting
        request that may be admitted (budget.prefill_shares), after the decode rows' tokens."""
        decode_tokens, prefilling = 0, []
        for req in self.running:
            left = req.num_tokens - req.num_computed_tokens
            if left > 1:
                prefilling.append(req)
            elif left == 1 and req.num_output_tokens < req.max_output_tokens:
                decode_tokens += 1 + len(req.spec_token_ids)
        room = self.config.max_num_seqs - len(self.running)
        queued = list(self.swapped)[:room]
        if not self.swapped:
            queued += list(self.waiting)[:room]
        candidates = prefilling + queued
        if not candidates:
            return {}
        budget = prefill_budget(self.speed.step_tokens(cap), decode_tokens, cap - decode_tokens)
        shares = prefill_shares([(r.priority, r.num_uncomputed_tokens) for r in candidates], budget)
        return dict(zip(candidates, shares))

    def _schedule_running(self, out: SchedulerOutput, scheduled: list, budget: int) -> int:
        # Runs for every running request every step: properties are spelled out.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_tokens = len(req.token_ids) + req.num_in_flight
            if num_tokens - req.num_prompt_tokens >= req.max_output_tokens:
                i += 1  # its last token is in flight; it ends when that lands
                continue
            n = min(num_tokens - req.num_computed_tokens, budget)
            if n > 1:  # a prompt chunk: its fair share of the step's prefill tokens
                n = min(n, self._shares.get(req, 0))
                if n == 0:
                    i += 1
                    continue
                if self.state_prefix is not None:
                    n = self.state_prefix.cut_chunk(req, n)
            if req.image_spans:
                n = req.whole_images(n)
            if req.spec_token_ids and n == 1:
                n += self._drafts(req, out, budget - 1)
            total = req.num_computed_tokens + n
            if not self.blocks.fits(req, total):  # most decode steps fit: no allocation work
                fits, returned, before = self._make_room(req, total, out, scheduled)
                budget, i = budget + returned, i - before
                if not fits:
                    continue  # req itself was preempted: running[i] is the next one now
                self._allocate(req, total, out)
            scheduled.append((req, n))
            budget -= n
            i += 1
        return budget

    def _drafts(self, req: Request, out: SchedulerOutput, room: int) -> int:
        """A decode row's draft tokens (speculative decoding: computed after its last token, then
        verified), as many as the budget and max_tokens leave room for."""
        left = req.max_output_tokens - req.num_output_tokens - 1
        drafts = req.spec_token_ids[: max(0, min(room, left))]
        req.spec_token_ids = []
        if drafts:
            out.spec_token_ids[req.request_id] = drafts
        return len(drafts)

    def _allocate(self, req: Request, total: int, out: SchedulerOutput) -> None:
        """Blocks for req's first total tokens, and what the runner must learn of them."""
        before = list(req.block_table) if req.runner_knows else None
        copies = self.blocks.allocate(req, total)
        out.blocks_to_copy += copies
        if before is None:
            return
        if copies:
            out.replaced_block_tables[req.request_id] = list(req.block_table)
        elif len(req.block_table) > len(before):
            out.new_block_ids[req.request_id] = req.block_table[len(before):]

    def _make_room(self, req: Request, num_tokens: int, out: SchedulerOutput,
                   scheduled: list[tuple[Request, int]]) -> tuple[bool, int, int]:
        """Preempt running requests until req fits (preemption.next_victim's order); a victim
        already scheduled this step leaves the step. Returns (req still runs, the budget the
        victims hand back, how many victims stood before req in the running list)."""
        returned = before = 0
        while not self.blocks.can_allocate(self.blocks.new_blocks_needed(req, num_tokens)):
            at, victim = next_victim(self.running)
            before += at < self.running.index(req)
            returned += unschedule(victim, scheduled, out)
            self._preempt(victim, out)
            if victim is req:
                return False, returned, before
        return True, returned, before

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        out.preempted_request_ids.append(req.request_id)
        # Drafts are for this step's row, which it no longer has: after it resumes they would
        # ride a row they were not made for (its proposer drafts again then).
        req.spec_token_ids = []
        out.spec_token_ids.pop(req.request_id, None)
        known, req.runner_knows = req.runner_knows, False
        self.counters.num_preemptions += 1
        if self.swap is not None and self.swap.can_swap_out(req) and (
                self.state_prefix is None or (known and self.state_prefix.swap_out(req, out.state_swap_outs))):
            out.blocks_to_swap_out += self.swap.swap_out(self.blocks, req)
            req.status = RequestStatus.SWAPPED
            self.swapped.appendleft(req)  # victims come latest-first: keep arrival order
            return
        self.blocks.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)

    def _schedule_swapped(self, out: SchedulerOutput, scheduled: list, budget: int) -> int:
        while self.swapped and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.swapped[0]
            if req.num_in_flight or not adapter_fits(req, self.running, self.config.max_loras):
                break  # its last step has not landed (resume it once its tokens are known), or no adapter slot
            n = min(req.num_uncomputed_tokens, budget, self._shares.get(req, 0))
            if n == 0:
                break
            if req.image_spans:
                n = req.whole_images(n)
            total = req.num_computed_tokens + n
            extra = max(0, self.blocks.blocks_for(total) - len(req.host_block_table))
            if not self.blocks.can_allocate(len(req.host_block_table) + extra):
                break
            self.swapped.popleft()
            out.blocks_to_swap_in += self.swap.swap_in(self.blocks, req)
            if self.state_prefix is not None:
                self.state_prefix.swap_in(req)
            self._allocate(req, total, out)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append((req, n))
            budget -= n
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, scheduled: list, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            share = self._shares.get(req, 0)
            if req.num_in_flight or share == 0:
                break  # preempted with a step in flight (recompute once its tokens are known), or no share
            if not adapter_fits(req, self.running, self.config.max_loras):
                break  # every adapter slot serves running requests: wait for one to free
            req.num_computed_tokens = self.blocks.match_prefix(req)
            if self.state_prefix is not None:
                req.num_computed_tokens = self.state_prefix.cut_match(req)
            n = min(req.num_uncomputed_tokens, budget, share)
            if self.state_prefix is not None:
                n = self.state_prefix.cut_chunk(req, n)
            if req.image_spans:
                n = req.whole_images(n)
            total = req.num_computed_tokens + n
            if not self.blocks.can_allocate(self.blocks.new_blocks_needed(req, total)):
                self.blocks.free(req)  # give the prefix hits back until it can run
                req.num_computed_tokens = 0
                if self.state_prefix is not None:
                    self.state_prefix.unmatched(req)
                break
            self.waiting.popleft()
            self._count_prefix_hit(req)
            self._allocate(req, total, out)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append((req, n))
            budget -= n

    def unrun(self, out: SchedulerOutput) -> None:
        """A step that failed before it ran: its rows' computed counts step back (scheduling
        advanced them), so the step in flight, landing after, publishes to the prefix cache only
        blocks that it wrote, not blocks this one was to fill."""
        for rid, n in zip(out.request_ids, out.num_scheduled_tokens):
            req = self.requests.get(rid)
            if req is not None:
                req.num_computed_tokens -= n

    def recompute_swapped(self, request_ids: list[str]) -> None:
        """Send swapped-out requests back to recompute (a failed step's swap-out may not have run)."""
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None and req.status is RequestStatus.SWAPPED:
                self.swapped.remove(req)
                self.swap.free(req)
                if self.state_prefix is not None:
                    self.state_prefix.forget(req)
                req.num_computed_tokens = 0
                req.status = RequestStatus.WAITING
                self.waiting.appendleft(req)

    def _count_prefix_hit(self, req: Request) -> None:
        if req.num_output_tokens == 0:  # count each prompt once, not on every resume
            req.num_cached_tokens = req.num_computed_tokens
            self.counters.prefix_queried_tokens += req.num_tokens
            self.counters.prefix_hit_tokens += req.num_computed_tokens

    def _after_schedule(self, out: SchedulerOutput, scheduled: list[tuple[Request, int]]) -> None:
        """Rows in order; new requests' data once; computed counts advance now (the step is as
        good as run: a failed step fails its requests) and a row that samples puts a token in
        flight."""
        ids, counts, starts = out.request_ids, out.num_scheduled_tokens, out.num_computed_tokens
        now = None
        for req, n in scheduled:
            ids.append(req.request_id)
            counts.append(n)
            starts.append(req.num_computed_tokens)
            if not req.runner_knows:
                req.runner_knows = True
                out.new_requests.append(NewRequestData(
                    req.request_id, list(req.token_ids), req.num_prompt_tokens, req.params,
                    sorted(req.eos_token_ids), list(req.block_table), req.images, req.lora_id or 0))
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = now = now or time.monotonic()
                    self._first_scheduled.append(req)
            if self.state_prefix is not None:
                self.state_prefix.note_row(req, n, out.state_restores, out.state_saves)
            drafts = len(out.spec_token_ids.get(req.request_id, ()))
            req.num_computed_tokens += n
            if req.num_computed_tokens - drafts == len(req.token_ids) + req.num_in_flight:
                req.num_in_flight += 1 + drafts  # each draft, if accepted, and one more token
        out.finished_request_ids, self._finished_ids = self._finished_ids, []

    # --- after the model ran -----------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, result: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Land a step's sampled tokens: record them, finish what they end, publish full
        blocks; one output per live request that ran in the step. The grammar matchers of
        one-token rows take their tokens in one batch, after the other checks."""
        self.speed.landed(out)
        outputs: dict[str, EngineCoreOutput | None] = {}
        logprobs = result.logprobs
        deferred = []  # one-token rows of constrained requests, taken, their matchers not yet
        for i, rid in enumerate(result.request_ids):
            req = self.requests.get(rid)
            if req is None or req.is_finished:  # aborted or finished since: a moot row
                continue
            sampled = result.sampled_token_ids[i]
            drafts = out.spec_token_ids.get(rid) if out.spec_token_ids else None
            if drafts:  # rejected drafts roll back by counts: their KV is simply overwritten later
                rejected = len(drafts) + 1 - len(sampled)
                req.num_in_flight -= rejected
                req.num_computed_tokens -= rejected
            lp = logprobs[i] if logprobs else None
            if req.grammar is not None and len(sampled) == 1:
                outputs[rid] = None  # keeps the rows' order
                deferred.append((req, sampled, lp, self._take_one(req, sampled[0])))
            else:
                outputs[rid] = self._land(req, sampled, lp)
        if deferred:
            self._land_constrained(deferred, outputs)
        if len(outputs) < len(out.request_ids):  # prompt chunks that sampled nothing
            for rid in out.request_ids:
                if rid not in outputs and (req := self.requests.get(rid)) is not None:
                    self.blocks.commit_full_blocks(req)
        for req in self._first_scheduled:
            if not req.is_finished or req.request_id in outputs:
                got = outputs.get(req.request_id)
                if got is None:
                    outputs[req.request_id] = got = EngineCoreOutput(req.request_id)
                got.first_scheduled_time = req.first_scheduled_time
        self._first_scheduled = []
        return list(outputs.values())

    def _land(self, req: Request, tokens: list[int], logprobs: list[TokenLogprob] | None) -> EngineCoreOutput:
        taken, reason = 0, None
        for token in tokens:
            taken += 1
            reason = self._take_one(req, token)
            if req.grammar is not None and reason != "stop":  # a complete grammar ends it as "stop"
                reason = req.grammar.advance(token) or reason
            if reason is not None:
                break
        return self._settle(req, tokens[:taken], logprobs[:taken] if logprobs else None, reason)

    @staticmethod
    def _take_one(req: Request, token: int) -> str | None:
        req.num_in_flight -= 1
        req.token_ids.append(token)
        return req.stop_reason_for(token)

    def _land_constrained(self, rows: list, outputs: dict[str, EngineCoreOutput | None]) -> None:
        """As _land, the matchers taking the tokens that did not stop their rows in one batch."""
        from mlxr.engine.structured import matcher

        advancing = [(req.grammar, tokens[0]) for req, tokens, _, reason in rows if reason != "stop"]
        results = iter(matcher.advance_all(advancing) if advancing else ())
        for req, tokens, lp, reason in rows:
            if reason != "stop":
                reason = next(results) or reason
            outputs[req.request_id] = self._settle(req, tokens, lp[:1] if lp else None, reason)

    def _settle(self, req: Request, tokens: list[int], logprobs: list[TokenLogprob] | None,
                reason: str | None) -> EngineCoreOutput:
        out = EngineCoreOutput(req.request_id, tokens, logprobs, reason, req.stop_reason, req.num_cached_tokens)
        if reason == "error":
            out.error = f"the grammar refused token {tokens[-1]}: {req.grammar.error}"
        self.blocks.commit_full_blocks(req)  # a finished request's blocks stay cached for others
        if reason is not None:
            self.finish(req, reason)
        return out

    def fail(self, request_ids: list[str], error: str) -> list[EngineCoreOutput]:
        """Finish the given live requests with an error (a failed step)."""
        return [EngineCoreOutput(r.request_id, finish_reason="error", error=error)
                for r in self.abort(request_ids, "error")]
