"""Sequences and requests: the pure-Python state the scheduler and block manager work on."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from mlxr.types import SamplingParams

# The token of a step still running on the device: the engine appends it when it launches
# the step and writes the real id when the step's result reaches the host.
PLACEHOLDER = -1


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One generated continuation. token_ids is prompt + output; the last token's KV may be
    missing: tokens [num_computed_tokens:] still have to run through the model."""

    seq_id: int
    request_id: str
    index: int  # which of the request's n samples
    token_ids: list[int]
    num_prompt_tokens: int
    arrival_time: float
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # one per full, committed block
    host_block_table: list[int] = field(default_factory=list)  # while swapped out
    finish_reason: str | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    max_output_tokens: int | None = None  # the request's max_tokens

    @property
    def has_all_outputs(self) -> bool:
        """Its last output token is known or in flight: nothing left to compute."""
        return self.max_output_tokens is not None and self.num_output_tokens >= self.max_output_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        """The tokens known on the host (a trailing placeholder is left out)."""
        end = -1 if self.token_ids and self.token_ids[-1] == PLACEHOLDER else None
        return self.token_ids[self.num_prompt_tokens : end]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def in_prefill(self) -> bool:
        return self.num_uncomputed_tokens > 1


@dataclass(eq=False)
class Request:
    """A user request: a prompt and its n sequences (forked once the prompt is computed)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    seqs: list[Sequence] = field(default_factory=list)

    @property
    def is_finished(self) -> bool:
        seqs = self.seqs
        if len(seqs) == 1 and self.params.n == 1:  # the common case, checked every step
            return seqs[0].status is SequenceStatus.FINISHED
        if len(seqs) != self.params.n:
            return False
        for s in seqs:  # a loop, not all(): this runs for every request every step
            if s.status is not SequenceStatus.FINISHED:
                return False
        return True
