"""Which prefix block hashes have a recurrent-state checkpoint (kv/state_checkpoints.py holds
the tensors), for prefix caching of hybrid models. Bounded: a fixed number of checkpoints, the
least recently used one evicted for a new one; a block's checkpoint goes with the block when
the block manager evicts it. Torch-free: the scheduler decides, the runner copies."""
from __future__ import annotations

from collections import OrderedDict


class StateCheckpointIndex:
    def __init__(self, num_checkpoints: int) -> None:
        self.num_checkpoints = num_checkpoints
        self._slot_of: OrderedDict[bytes, int] = OrderedDict()  # block hash -> checkpoint, LRU first
        self._free = list(range(num_checkpoints - 1, -1, -1))
        self._held: dict[bytes, int] = {}  # swapped-out requests' states, never evicted

    def __contains__(self, h: bytes) -> bool:
        return h in self._slot_of

    def __len__(self) -> int:
        return len(self._slot_of)

    def lookup(self, h: bytes) -> int | None:
        """The checkpoint of block hash h (now the most recently used), or None."""
        slot = self._slot_of.get(h)
        if slot is not None:
            self._slot_of.move_to_end(h)
        return slot

    def deepest(self, hashes: list[bytes]) -> int:
        """How many of a chain's leading blocks a resume can cover: up to and including the
        deepest one with a checkpoint (0: none)."""
        for depth in range(len(hashes), 0, -1):
            if hashes[depth - 1] in self._slot_of:
                return depth
        return 0

    def reserve(self, h: bytes, pinned: frozenset[int] = frozenset()) -> int | None:
        """A checkpoint for block hash h, taking the least recently used one when the pool is
        full, except those in `pinned` (read this step); None when there is no room."""
        if h in self._slot_of:
            return self.lookup(h)
        if not self._free:
            victim = next((k for k, s in self._slot_of.items() if s not in pinned), None)
            if victim is None:
                return None
            self._free.append(self._slot_of.pop(victim))
        slot = self._slot_of[h] = self._free.pop()
        return slot

    def hold(self, key: bytes) -> int | None:
        """A checkpoint no eviction takes (a swapped-out request's state) until let_go(key)."""
        slot = self.reserve(key, frozenset(self._held.values()))
        if slot is not None:
            self._slot_of.pop(key)  # out of the LRU order: never a victim
            self._held[key] = slot
        return slot

    def held(self, key: bytes) -> int | None:
        return self._held.get(key)

    def let_go(self, key: bytes) -> None:
        slot = self._held.pop(key, None)
        if slot is not None:
            self._free.append(slot)

    def drop(self, h: bytes) -> None:
        """Forget h's checkpoint (its block left the prefix cache)."""
        slot = self._slot_of.pop(h, None)
        if slot is not None:
            self._free.append(slot)

    def clear(self) -> None:
        self._slot_of.clear()
        self._free = list(range(self.num_checkpoints - 1, -1, -1))
