"""Which running request a scheduler preempts when KV blocks run out, and taking one out of a
step it was already placed in. Pure Python."""
from __future__ import annotations

from mlxr.engine.records import SchedulerOutput
from mlxr.engine.sched.request import Request


def next_victim(running: list[Request]) -> tuple[int, Request]:
    """(position, request): the lowest priority (the largest value, as vLLM's priority policy),
    the latest admitted among equals."""
    return max(enumerate(running), key=lambda p: (p[1].priority, p[0]))


def unschedule(req: Request, scheduled: list[tuple[Request, int]], out: SchedulerOutput) -> int:
    """Take req out of this step (it is being preempted): its tokens, and what the runner was to
    learn of its blocks (their copy-on-write copies too: the blocks go back to the pool). Returns
    the tokens it held, 0 where it was not placed yet."""
    at = next((k for k, (r, _) in enumerate(scheduled) if r is req), None)
    if at is None:
        return 0
    _, n = scheduled.pop(at)
    out.new_block_ids.pop(req.request_id, None)
    out.replaced_block_tables.pop(req.request_id, None)
    mine = set(req.block_table)
    out.blocks_to_copy = [(src, dst) for src, dst in out.blocks_to_copy if dst not in mine]
    return n
