"""A step's token budget: how many tokens a step takes (from the device's measured speed) and
how the prefill part is shared between requests (max-min fair, by priority). Pure Python.

A step cannot be interrupted, so a request that arrives waits for the step running, then for
its own: both are kept near a target time, whatever the device. Within a step, decode rows
come first (a token each); prefill rows share the rest so a short prompt is computed whole in
the step after it arrives while a long one goes on in chunks beside it."""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

FIRST_STEP_TOKENS = 256  # a step's tokens before any step has been timed
# However slow the device, a step takes this many tokens: a prompt chunk below it costs more
# per token (the CPU attention reads each K/V tile once per block of 128 query rows; on the
# 2-core host 128-token chunks of a 4k prompt took ~3x the time of 2,048-token ones).
MIN_STEP_TOKENS = 128
MIN_TIMED_TOKENS = 32  # smaller steps are mostly fixed cost: their time says little per token
MIN_SHARE = 16  # a prefill row's fewest tokens: a long queue is not spread into 1-token rows
SMOOTHING = 0.3  # weight of the newest step in the moving average
# A step's sample counts as this many times the average at most: one slow step (a kernel
# compiled on first use, a collection) shrinks the next ones little; a slower device still
# shows within a few steps.
MAX_SAMPLE_RATIO = 4.0
MAX_LAUNCHED = 8  # steps remembered until they land (a failed one never does)


class StepSpeed:
    """Seconds per scheduled token, a moving average over the steps that landed, and the step
    size that keeps a step near target_s. A step's time runs from the later of its launch and
    the previous step's landing to its own landing (under overlap the device starts it once the
    one before is done). target_s 0: no timing, every step may take the whole budget."""

    def __init__(self, target_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.target_s = target_s
        self.clock = clock
        self.s_per_token: float | None = None
        self._launched: deque[tuple[object, float, int]] = deque()
        self._last_landed = float("-inf")

    def step_tokens(self, cap: int) -> int:
        """Tokens for the next step: the target time's worth at the measured speed, within cap."""
        if self.target_s <= 0:
            return cap
        if self.s_per_token is None:
            return min(cap, FIRST_STEP_TOKENS)
        return min(cap, max(MIN_STEP_TOKENS, int(self.target_s / self.s_per_token)))

    def launched(self, step: object, num_tokens: int) -> None:
        if self.target_s <= 0 or not num_tokens:
            return
        self._launched.append((step, self.clock(), num_tokens))
        if len(self._launched) > MAX_LAUNCHED:
            self._launched.popleft()

    def landed(self, step: object) -> None:
        while self._launched:
            launched, t, n = self._launched.popleft()
            if launched is step:
                break
        else:
            return
        now = self.clock()
        start, self._last_landed = max(t, self._last_landed), now
        if n >= MIN_TIMED_TOKENS and now > start:
            sample = (now - start) / n
            prev = self.s_per_token
            if prev is not None:
                sample = min(sample, MAX_SAMPLE_RATIO * prev)
            self.s_per_token = sample if prev is None else prev + SMOOTHING * (sample - prev)


def prefill_budget(step_tokens: int, decode_tokens: int, room: int) -> int:
    """The step's tokens left for prefill rows once decode rows have theirs; never below a
    quarter of the step, so many decodes do not hold new prompts back (within room, the
    step's hard cap less the decode tokens)."""
    return max(0, min(room, max(step_tokens - decode_tokens, step_tokens // 4)))


def fair_shares(needs: Sequence[int], budget: int) -> list[int]:
    """Max-min fair split (water-filling): each gets its need or an equal part of what the
    smaller needs left over, whichever is less."""
    shares = [0] * len(needs)
    left, open_ = budget, len(needs)
    for i in sorted(range(len(needs)), key=needs.__getitem__):
        shares[i] = min(needs[i], left // open_)
        left -= shares[i]
        open_ -= 1
    return shares


def prefill_shares(candidates: Sequence[tuple[int, int]], budget: int) -> list[int]:
    """Tokens per candidate (priority, need), in the order given (the queue's): lower priority
    values first, each class sharing fairly what the ones before it left. Candidates join,
    earliest first within a class, while each can have its need or MIN_SHARE tokens (two at
    least join), so a long queue is not spread into one-token rows."""
    order, floor = [], 0
    for i in sorted(range(len(candidates)), key=lambda i: candidates[i][0]):
        floor += min(candidates[i][1], MIN_SHARE)
        if floor > budget and len(order) >= 2:
            break
        order.append(i)
    shares = [0] * len(candidates)
    left, start = budget, 0
    while start < len(order) and left > 0:
        priority = candidates[order[start]][0]
        end = start
        while end < len(order) and candidates[order[end]][0] == priority:
            end += 1
        members = order[start:end]
        for i, share in zip(members, fair_shares([candidates[i][1] for i in members], left)):
            shares[i] = share
            left -= share
        start = end
    return shares
