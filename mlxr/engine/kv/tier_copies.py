"""How the KV tiers' queued copies are grouped so that a restored prefix costs a handful of
large transfers, not one per block per layer.

The block manager queues copies one block at a time, interleaved (a block evicted to host memory,
then a block loaded into it, then the next pair). plan() regroups them into phases: in each phase
every copy out of the device (saves to host slots, blocks to persist) runs before every copy into
it (loads), which is the order they were queued in unless a later copy touches what an earlier
one did; such a copy starts a new phase. Pure Python (no torch)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Phase:
    saves: list[tuple[int, int]] = field(default_factory=list)  # (device block, host slot)
    persists: list[tuple[object, int]] = field(default_factory=list)  # (block identity, device block)
    loads: list[tuple[object, int]] = field(default_factory=list)  # (host slot or payload, device block)
    # What the phase has touched so far: device blocks loaded into, host slots loaded from.
    _loaded: set[int] = field(default_factory=set)
    _slots_read: set[int] = field(default_factory=set)

    def accepts(self, op: tuple) -> bool:
        """Whether op can join without changing what any copy reads or writes."""
        kind = op[0]
        if kind == "save":  # ("save", device block, host slot)
            # Saves run first: not after a load into its block, nor before a load of its slot.
            # (Two saves to one slot keep their order: saves are sorted stably, copied in order.)
            return op[1] not in self._loaded and op[2] not in self._slots_read
        return op[2] not in self._loaded  # ("persist", identity, block) | ("load", source, block)

    def add(self, op: tuple) -> None:
        kind, a, b = op
        if kind == "save":
            self.saves.append((a, b))
        elif kind == "persist":
            self.persists.append((a, b))
        else:
            self.loads.append((a, b))
            self._loaded.add(b)
            if isinstance(a, int):
                self._slots_read.add(a)


def plan(ops: list[tuple]) -> list[Phase]:
    """ops in queue order -> phases that give the same result when each runs saves, persists,
    then loads."""
    phases = [Phase()]
    for op in ops:
        if not phases[-1].accepts(op):
            phases.append(Phase())
        phases[-1].add(op)
    return phases


def runs(indices: list[int]) -> list[tuple[int, int, int]]:
    """Sorted indices as runs of consecutive values: (position in the list, first value, length)."""
    out: list[tuple[int, int, int]] = []
    for pos, value in enumerate(indices):
        if out and value == out[-1][1] + out[-1][2]:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((pos, value, 1))
    return out
