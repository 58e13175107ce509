"""Token-budget scheduler: decode and prefill chunks share each step, first come first served,
preemption by recompute when KV blocks run out. Pure Python."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from mlxr.engine.block_manager import BlockManager, SwapSpace
from mlxr.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int  # tokens to compute this step, from seq.num_computed_tokens on


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, host)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)  # (host, device)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class SchedulerCounters:
    num_preemptions: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, block_manager: BlockManager, swap: SwapSpace | None = None
    ) -> None:
        self.config = config
        self.blocks = block_manager
        self.swap = swap
        self.waiting: deque[Sequence] = deque()
        self.swapped: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.counters = SchedulerCounters()

    # --- membership --------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """A fork that already shares its parent's computed blocks."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark seq finished (from any state) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.swapped:
            self.swapped.remove(seq)
            self.swap.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = seq.finish_reason or reason
        self.blocks.free(seq)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # --- one step ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            budget = self._schedule_swapped(out, budget)
        if not out.preempted and not self.swapped:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        # Runs for every running sequence every step: Sequence's properties are spelled out.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_tokens, limit = len(seq.token_ids), seq.max_output_tokens
            if limit is not None and num_tokens - seq.num_prompt_tokens >= limit:
                i += 1  # has_all_outputs: its last token is still in flight; it ends when that lands
                continue
            n = min(num_tokens - seq.num_computed_tokens, budget)
            total = seq.num_computed_tokens + n
            if not self.blocks.fits(seq, total):  # most decode steps fit: no allocation work
                if not self._make_room(seq, total, out):
                    break  # seq itself was preempted; everything after it already was
                out.blocks_to_copy += self.blocks.allocate(seq, total)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
            i += 1
        return budget

    def _make_room(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> bool:
        """Preempt the latest-arrived running sequences until seq fits; False if seq went."""
        while not self.blocks.can_allocate(self.blocks.new_blocks_needed(seq, num_tokens)):
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        out.preempted.append(seq)
        self.counters.num_preemptions += 1
        if self.swap is not None and self.swap.can_swap_out(seq):
            out.blocks_to_swap_out += self.swap.swap_out(self.blocks, seq)
            seq.status = SequenceStatus.SWAPPED
            self.swapped.appendleft(seq)  # victims come latest-first: keep arrival order
            return
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def _schedule_swapped(self, out: SchedulerOutput, budget: int) -> int:
        while self.swapped and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.swapped[0]
            n = min(seq.num_uncomputed_tokens, budget)
            total = seq.num_computed_tokens + n
            extra = max(0, self.blocks.blocks_for(total) - len(seq.host_block_table))
            if not self.blocks.can_allocate(len(seq.host_block_table) + extra):
                break
            self.swapped.popleft()
            out.blocks_to_swap_in += self.swap.swap_in(self.blocks, seq)
            out.blocks_to_copy += self.blocks.allocate(seq, total)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            seq.num_computed_tokens = self.blocks.match_prefix(seq)
            n = min(seq.num_uncomputed_tokens, budget)
            total = seq.num_computed_tokens + n
            if not self.blocks.can_allocate(self.blocks.new_blocks_needed(seq, total)):
                self.blocks.free(seq)  # give the prefix hits back until it can run
                seq.num_computed_tokens = 0
                break
            self.waiting.popleft()
            self._count_prefix_hit(seq)
            out.blocks_to_copy += self.blocks.allocate(seq, total)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n

    def _count_prefix_hit(self, seq: Sequence) -> None:
        if seq.num_output_tokens == 0:  # count each prompt once, not on every resume
            seq.num_cached_tokens = seq.num_computed_tokens
            self.counters.prefix_queried_tokens += seq.num_tokens
            self.counters.prefix_hit_tokens += seq.num_computed_tokens

    def recompute_swapped(self, seqs: list[Sequence]) -> None:
        """Send swapped-out sequences back to recompute (their host copy may be stale)."""
        for seq in seqs:
            if seq in self.swapped:
                self.swapped.remove(seq)
                self.swap.free(seq)
                seq.num_computed_tokens = 0
                seq.status = SequenceStatus.WAITING
                self.waiting.appendleft(seq)

    # --- after the model ran -------------------------------------------------------------------
    def update(self, out: SchedulerOutput, skip_finished: bool = False) -> None:
        """Advance computed counts of the sequences that ran and publish full blocks
        (skip_finished: not for those that finished since the step was scheduled)."""
        for s in out.scheduled:
            if skip_finished and s.seq.is_finished:
                continue
            s.seq.num_computed_tokens += s.num_tokens
            self.blocks.commit_full_blocks(s.seq)
