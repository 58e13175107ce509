"""Prefix caching for hybrid models (recurrent-state layers beside paged K/V): a prefix is only
reusable up to a block whose recurrent state was kept as a checkpoint (state_index.py), so a
match is cut back to the deepest such block, and the runner copies that state into the
request's slot before its first step (SchedulerOutput.state_restores).

Which boundaries are checkpointed: one a prompt, the end of its last full block short of its
last token (the deepest point a later request with the same prompt may resume from; a prompt
chunk is cut to end there, since a state exists only where a chunk ends). One checkpoint a
prompt keeps the pool's memory bounded by prompts, not by their length (docs/kv-cache.md)."""
from __future__ import annotations

from mlxr.engine.sched.block_manager import BlockManager
from mlxr.engine.sched.request import Request
from mlxr.engine.sched.state_index import StateCheckpointIndex


class StatePrefix:
    def __init__(self, blocks: BlockManager, index: StateCheckpointIndex) -> None:
        self.blocks, self.index = blocks, index
        self._restores: dict[str, int] = {}  # request id -> checkpoint, for its first step
        self._saved: dict[str, bytes] = {}  # request id -> the block hash its checkpoint is for
        blocks.state_index = index

    def boundary(self, req: Request) -> int:
        """The token count whose state a prompt keeps (0: none, a prompt of one block or less)."""
        bs = self.blocks.block_size
        return (req.num_prompt_tokens - 1) // bs * bs

    def cut_chunk(self, req: Request, n: int) -> int:
        """n tokens from req's computed ones, cut so that no chunk steps over its boundary."""
        b = self.boundary(req)
        start = req.num_computed_tokens
        return b - start if start < b < start + n else n

    def cut_match(self, req: Request) -> int:
        """After BlockManager.match_prefix: give back matched blocks past the deepest one with a
        checkpoint; returns the tokens still covered."""
        depth = self.index.deepest(req.block_hashes)
        for block in reversed(req.block_table[depth:]):
            self.blocks._release(block)
        del req.block_table[depth:], req.block_hashes[depth:]
        self._restores.pop(req.request_id, None)
        if depth:
            self._restores[req.request_id] = self.index.lookup(req.block_hashes[depth - 1])
        return depth * self.blocks.block_size

    def unmatched(self, req: Request) -> None:
        """req's prefix hits were given back (it did not fit): nothing to restore."""
        self._restores.pop(req.request_id, None)

    def note_row(self, req: Request, n: int, restores: list, saves: list) -> None:
        """A scheduled row (before its computed count advances): its restore, if it resumes from a
        checkpoint, and its save, if the chunk ends at its prompt's boundary."""
        ckpt = self._restores.pop(req.request_id, None)
        if ckpt is not None:
            restores.append((req.request_id, ckpt))
        b = self.boundary(req)
        if b and req.num_computed_tokens + n == b:
            h = self._hash_at(req, b // self.blocks.block_size)
            if h not in self.index:
                ckpt = self.index.reserve(h)
                if ckpt is not None:
                    saves.append((req.request_id, ckpt))
                    self._saved[req.request_id] = h

    def swap_out(self, req: Request, saves: list) -> bool:
        """Keep a preempted request's state in a held checkpoint (before the runner forgets its
        slot: SchedulerOutput.state_swap_outs); False when none is free (it recomputes)."""
        ckpt = self.index.hold(_swap_key(req))
        if ckpt is not None:
            saves.append((req.request_id, ckpt))
        return ckpt is not None

    def swap_in(self, req: Request) -> None:
        """req's state comes back into its new slot in its first step after the swap-in."""
        key = _swap_key(req)
        self._restores[req.request_id] = self.index.held(key)
        self.index.let_go(key)  # restored before that step's forward, reused after it at the earliest

    def forget(self, req: Request) -> None:
        """req finished or was aborted: a checkpoint kept for a block that never joined the
        prefix cache (aborted before its step landed) is given back."""
        self._restores.pop(req.request_id, None)
        self.index.let_go(_swap_key(req))
        h = self._saved.pop(req.request_id, None)
        if h is not None and h not in self.blocks.cached:
            self.index.drop(h)

    def _hash_at(self, req: Request, num_blocks: int) -> bytes:
        """The chained hash of req's first num_blocks blocks (as the block manager commits them)."""
        hashes = req.block_hashes[:num_blocks]
        h = hashes[-1] if hashes else req.lora_root
        for i in range(len(hashes), num_blocks):
            h = self.blocks._hash(req, h, i)
        return h


def _swap_key(req: Request) -> bytes:
    return b"swap:" + req.request_id.encode()
