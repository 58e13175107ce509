"""KV block allocation: reference counts, prefix caching by chained block hashes,
copy-on-write for shared partial blocks, and LRU eviction of cached free blocks.
Pure Python: block ids only, the tensors live in kv/cache.py."""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from mlxr.engine.sched.request import Request


@dataclass(frozen=True)
class BlockUsage:
    total: int
    used: int  # referenced by at least one sequence
    cached: int  # free but still holding a reusable prefix
    free: int  # allocatable now (cached ones included: they are evicted on demand)


def block_hash(parent: bytes | None, tokens: tuple[int, ...], images: bytes = b"") -> bytes:
    """Chained SHA-256 of a full block: Python's hash() is 64-bit and predictable, so a
    crafted collision could hand one user another user's KV (cf. vLLM CVE-2025-25183).
    images: the digests of the images whose placeholder tokens the block holds (with their
    offsets), so two images behind the same placeholders never share a block."""
    h = hashlib.sha256(parent or b"")
    h.update(array("q", tokens).tobytes())
    if images:
        h.update(images)
    return h.digest()


def block_images(seq: Request, i: int, block_size: int) -> bytes:
    """The image key of seq's block i: each overlapping image's digest and first position."""
    lo, hi = i * block_size, (i + 1) * block_size
    return b"".join(im.digest + im.offset.to_bytes(8, "little") for im in seq.images
                    if im.offset < hi and im.offset + im.length > lo)


class LowerTiers(Protocol):
    """Where prefix-cache blocks go when the device evicts them and come back from (kv/tiers.py)."""

    def evicted(self, h: bytes, block: int) -> None: ...

    def committed(self, h: bytes, block: int, parent: bytes | None, tokens: tuple[int, ...]) -> None: ...

    def prefetch(self, hashes: list[bytes]) -> None: ...

    def lookup(self, h: bytes) -> object | None: ...

    def load(self, source: object, block: int) -> None: ...


class BlockEvents(Protocol):
    """Told when a prefix block joins or leaves the device's cache (kv/events.py publishes it)."""

    def stored(self, h: bytes, parent: bytes | None, tokens: tuple[int, ...], lora_id: int | None = None) -> None: ...

    def removed(self, h: bytes) -> None: ...


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.hash_of: dict[int, bytes] = {}  # block id -> its prefix hash
        self.cached: dict[bytes, int] = {}  # prefix hash -> block id
        # Blocks with no reference, least recently freed first (evicted first).
        self.free_blocks: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        # Free blocks that hold a cached prefix, counted as they change: counting them when asked
        # walked every free block (~4 ms for 65k blocks, in the core loop every stats snapshot).
        self.num_cached_free = 0
        self.tiers: LowerTiers | None = None
        self.events: BlockEvents | None = None
        self.state_index = None  # hybrid models: state_index.StateCheckpointIndex (state_prefix.py)

    # --- figures -------------------------------------------------------------------------
    def usage(self) -> BlockUsage:
        free = len(self.free_blocks)
        return BlockUsage(self.num_blocks, self.num_blocks - free, self.num_cached_free, free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free_blocks)

    def new_blocks_needed(self, seq: Request, num_tokens: int) -> int:
        """Blocks to allocate so seq can hold num_tokens, counting a copy-on-write of the
        partial block its next token would write into."""
        need = max(0, self.blocks_for(num_tokens) - len(seq.block_table))
        return need + (1 if self._needs_copy(seq) else 0)

    def fits(self, seq: Request, num_tokens: int) -> bool:
        """Whether seq's blocks already hold num_tokens with no copy-on-write to do."""
        return num_tokens <= len(seq.block_table) * self.block_size and not self._needs_copy(seq)

    # --- allocation ------------------------------------------------------------------------
    def _take_free_block(self) -> int:
        block, _ = self.free_blocks.popitem(last=False)
        old_hash = self.hash_of.pop(block, None)
        if old_hash is not None:
            self.num_cached_free -= 1
        if old_hash is not None and self.cached.get(old_hash) == block:
            del self.cached[old_hash]
            if self.state_index is not None:  # a block's recurrent-state checkpoint goes with it
                self.state_index.drop(old_hash)
            if self.tiers is not None:
                self.tiers.evicted(old_hash, block)
            if self.events is not None:
                self.events.removed(old_hash)
        self.ref_counts[block] = 1
        return block

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        assert self.ref_counts[block] >= 0, "block freed twice"
        if self.ref_counts[block] == 0:
            self.free_blocks[block] = None
            if block in self.hash_of:
                self.num_cached_free += 1

    def _needs_copy(self, seq: Request) -> bool:
        idx = seq.num_computed_tokens // self.block_size
        return idx < len(seq.block_table) and self.ref_counts[seq.block_table[idx]] > 1

    def allocate(self, seq: Request, num_tokens: int) -> list[tuple[int, int]]:
        """Make room for seq's first num_tokens tokens; returns (src, dst) block copies to run
        before the step (copy-on-write). The caller checks can_allocate first."""
        assert self.can_allocate(self.new_blocks_needed(seq, num_tokens)), "out of KV blocks"
        copies = []
        if self._needs_copy(seq):
            idx = seq.num_computed_tokens // self.block_size
            src = seq.block_table[idx]
            dst = self._take_free_block()
            self._release(src)
            seq.block_table[idx] = dst
            copies.append((src, dst))
        while len(seq.block_table) < self.blocks_for(num_tokens):
            seq.block_table.append(self._take_free_block())
        return copies

    def take_blocks(self, n: int) -> list[int]:
        """n blocks owned by the caller (no request), e.g. for an embedding's one prefill."""
        assert self.can_allocate(n), "out of KV blocks"
        return [self._take_free_block() for _ in range(n)]

    def release_blocks(self, blocks: list[int]) -> None:
        """Give blocks back, last first."""
        for block in reversed(blocks):
            self._release(block)

    def free(self, seq: Request) -> None:
        # Tail blocks go first into the free order, so they are evicted before the shared head.
        self.release_blocks(seq.block_table)
        seq.block_table = []
        seq.block_hashes = []

    def fork(self, parent: Request, child: Request) -> None:
        """child shares all of parent's blocks (copy-on-write protects the partial one)."""
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        for block in child.block_table:
            self.ref_counts[block] += 1

    # --- prefix caching --------------------------------------------------------------------
    def match_prefix(self, seq: Request) -> int:
        """Reuse cached blocks for seq's leading full blocks; returns the tokens covered.
        At least one token is always left to compute, so the step produces logits."""
        if not self.enable_prefix_caching or seq.block_table:
            return 0
        max_blocks = (seq.num_tokens - 1) // self.block_size
        parent = seq.lora_root
        for i in range(max_blocks):
            h = self._hash(seq, parent, i)
            block = self.cached.get(h)
            if block is None:
                if self.tiers is not None:
                    self._match_with_tiers(seq, self._chain(seq, h, max_blocks))
                break
            self._reuse(seq, h, block)
            parent = h
        return len(seq.block_table) * self.block_size

    def _reuse(self, seq: Request, h: bytes, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self.free_blocks[block]
            self.num_cached_free -= block in self.hash_of  # a cached block leaves the free ones
        self.ref_counts[block] += 1
        seq.block_table.append(block)
        seq.block_hashes.append(h)

    def _chain(self, seq: Request, h: bytes, max_blocks: int) -> list[bytes]:
        """The hashes of seq's full blocks from the one hashed as h (the next to match) on."""
        hashes = [h]
        for i in range(len(seq.block_table) + 1, max_blocks):
            hashes.append(self._hash(seq, hashes[-1], i))
        return hashes

    def _match_with_tiers(self, seq: Request, hashes: list[bytes]) -> None:
        """Go on matching past the device cache's first miss: each block from the device cache
        or copied back from host memory or disk into a new block that joins the prefix cache,
        until no tier has one or loading would leave seq no room."""
        if self._no_room(seq):
            return
        self.tiers.prefetch([h for h in hashes if h not in self.cached])
        for h in hashes:
            block = self.cached.get(h)
            if block is None:
                if self._no_room(seq):
                    return
                source = self.tiers.lookup(h)
                if source is None:
                    return
                block = self._take_free_block()
                self.tiers.load(source, block)
                self.cached[h] = block
                self.hash_of[block] = h
                if self.events is not None:
                    parent = seq.block_hashes[-1] if seq.block_hashes else None  # an adapter's root is no block
                    self.events.stored(h, parent, self._block_tokens(seq, len(seq.block_table)), seq.lora_id)
                seq.block_table.append(block)
                seq.block_hashes.append(h)
            else:
                self._reuse(seq, h, block)

    def adopt(self, h: bytes) -> int | None:
        """A free, empty block to hold the prefix block hashed h, brought back by a lower tier
        before any request asks (kv_tiers.preload): cached and unreferenced, and last in the
        eviction order. None when h is cached already or no empty block is left (never evicts)."""
        block = next(iter(self.free_blocks), None)
        if h in self.cached or block is None or block in self.hash_of:
            return None
        self.free_blocks.move_to_end(block)
        self.cached[h] = block
        self.hash_of[block] = h
        self.num_cached_free += 1
        return block

    def _no_room(self, seq: Request) -> bool:
        return len(self.free_blocks) < self.blocks_for(seq.num_tokens) - len(seq.block_table)

    def commit_full_blocks(self, seq: Request) -> None:
        """Publish the hashes of blocks that seq has completely computed."""
        if not self.enable_prefix_caching:
            return
        # Only tokens known on the host can be hashed (a computed one may still be in flight), and
        # only blocks seq holds: one swapped out while its step was in flight holds none until
        # it is swapped back in (its later commits pick up from its hashes so far).
        full = min(seq.num_computed_tokens, len(seq.token_ids)) // self.block_size
        full = min(full, len(seq.block_table))
        while len(seq.block_hashes) < full:
            i = len(seq.block_hashes)
            # A request of a LoRA adapter chains from the adapter's root: its blocks never serve another.
            parent = seq.block_hashes[-1] if seq.block_hashes else seq.lora_root
            tokens = self._block_tokens(seq, i)
            images = block_images(seq, i, self.block_size) if seq.images else b""
            h = block_hash(parent, tokens, images)
            seq.block_hashes.append(h)
            # The lower tiers key a block by (parent, tokens) alone: image blocks stay on the device.
            self._publish(h, seq.block_table[i], parent, tokens, lower_tiers=not images, lora_id=seq.lora_id,
                          announced_parent=seq.block_hashes[-2] if i else None)

    def commit_blocks(self, blocks: list[int], token_ids: list[int]) -> None:
        """Publish the hashes of caller-owned blocks (take_blocks) that now hold token_ids' KV,
        full blocks only: a prompt scored or embedded between steps leaves its prefix cached for
        the request that may follow with it (echo with logprobs, then generation)."""
        if not self.enable_prefix_caching:
            return
        parent = None
        bs = self.block_size
        for i in range(min(len(token_ids) // bs, len(blocks))):
            tokens = tuple(token_ids[i * bs: (i + 1) * bs])
            h = block_hash(parent, tokens)
            self._publish(h, blocks[i], parent, tokens)
            parent = h

    def _publish(self, h: bytes, block: int, parent: bytes | None, tokens: tuple[int, ...],
                 lower_tiers: bool = True, lora_id: int | None = None,
                 announced_parent: bytes | None | bool = False) -> None:
        """announced_parent: the parent block the events name (an adapter's root is none); by default parent."""
        if h not in self.cached and block not in self.hash_of:
            self.cached[h] = block
            self.hash_of[block] = h
            if self.tiers is not None and lower_tiers:
                self.tiers.committed(h, block, parent, tokens)
            if self.events is not None:
                self.events.stored(h, parent if announced_parent is False else announced_parent, tokens, lora_id)

    def _hash(self, seq: Request, parent: bytes | None, i: int) -> bytes:
        tokens = self._block_tokens(seq, i)
        return block_hash(parent, tokens, block_images(seq, i, self.block_size) if seq.images else b"")

    def _block_tokens(self, seq: Request, i: int) -> tuple[int, ...]:
        return tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])


class SwapSpace:
    """Host-memory blocks that preempted sequences are swapped out to (pure Python ids)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))

    def can_swap_out(self, seq: Request) -> bool:
        return len(seq.block_table) <= len(self.free_blocks)

    def swap_out(self, bm: BlockManager, seq: Request) -> list[tuple[int, int]]:
        """Move seq's device blocks to host blocks; returns (device, host) copies to run."""
        pairs = [(block, self.free_blocks.pop()) for block in seq.block_table]
        for block in reversed(seq.block_table):
            bm._release(block)
        seq.block_table = []
        seq.host_block_table = [host for _, host in pairs]
        return pairs

    def swap_in(self, bm: BlockManager, seq: Request) -> list[tuple[int, int]]:
        """Bring seq's blocks back into fresh device blocks; returns (host, device) copies."""
        assert bm.can_allocate(len(seq.host_block_table)), "out of KV blocks"
        pairs = [(host, bm._take_free_block()) for host in seq.host_block_table]
        self.free_blocks += reversed(seq.host_block_table)
        seq.host_block_table = []
        seq.block_table = [dev for _, dev in pairs]
        return pairs

    def free(self, seq: Request) -> None:
        self.free_blocks += reversed(seq.host_block_table)
        seq.host_block_table = []

    @property
    def used(self) -> int:
        return self.num_blocks - len(self.free_blocks)
