"""Where a request goes among data-parallel engine cores: to the replica holding the longest
prefix of its prompt's full blocks, named by the chained block hashes the KV events carry
(kv/events.py: each replica's BlockStored / BlockRemoved keep its index here), then to the
least loaded (running and waiting tokens). A prompt just placed counts as held by its replica
until its events arrive, so a burst sharing a prefix lands together."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import msgspec

from mlxr.engine.kv.events import AllBlocksCleared, BlockStored, EventBatch, external_hash
from mlxr.engine.sched.block_manager import block_hash

# Affinity yields to load when the replica holding the prefix carries this many more tokens than
# the least loaded one: a popular prefix must not pile every request onto one core.
AFFINITY_SLACK_TOKENS = 8192
RECENT_BLOCKS = 65_536  # just-placed blocks remembered per replica (oldest forgotten first)
REASONS = ("prefix", "load", "balance")  # placed by affinity, by load (no prefix held), affinity overruled


@dataclass
class ReplicaIndex:
    """One replica's cached blocks (external hashes, any medium) and its just-placed ones."""

    blocks: dict[int, set[str]] = field(default_factory=dict)  # hash -> media holding it
    recent: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def apply(self, batch: EventBatch) -> None:
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self.clear()
            elif isinstance(event, BlockStored):
                for h in event.block_hashes:
                    self.blocks.setdefault(h, set()).add(event.medium or "")
            else:
                for h in event.block_hashes:
                    media = self.blocks.get(h)
                    if media is not None:
                        media.discard(event.medium or "")
                        if not media:
                            del self.blocks[h]
                    self.recent.pop(h, None)

    def clear(self) -> None:
        self.blocks.clear()
        self.recent.clear()

    def holds(self, h: int) -> bool:
        return h in self.blocks or h in self.recent

    def placed(self, hashes: list[int]) -> None:
        for h in hashes:
            self.recent[h] = None
            self.recent.move_to_end(h)
        while len(self.recent) > RECENT_BLOCKS:
            self.recent.popitem(last=False)


def prompt_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """The external hashes of the blocks a replica's prefix cache could match for this prompt
    (full blocks, the last token always left to compute, as BlockManager.match_prefix)."""
    out, parent = [], None
    for i in range((len(token_ids) - 1) // block_size):
        parent = block_hash(parent, tuple(token_ids[i * block_size:(i + 1) * block_size]))
        out.append(external_hash(parent))
    return out


def matched(index: ReplicaIndex, hashes: list[int]) -> int:
    n = 0
    while n < len(hashes) and index.holds(hashes[n]):
        n += 1
    return n


class Placement:
    def __init__(self, size: int, block_size: int, slack_tokens: int = AFFINITY_SLACK_TOKENS) -> None:
        self.block_size, self.slack = block_size, slack_tokens
        self.indexes = [ReplicaIndex() for _ in range(size)]
        self.counts = [dict.fromkeys(REASONS, 0) for _ in range(size)]
        self._decode = msgspec.msgpack.Decoder(EventBatch).decode

    def take_events(self, rank: int, payload: bytes) -> None:
        self.indexes[rank].apply(self._decode(payload))

    def choose(self, token_ids: list[int], loads: list[int | None]) -> tuple[int, str]:
        """A replica for the prompt among those up (load not None), and why."""
        up = [r for r, load in enumerate(loads) if load is not None]
        assert up, "no replica is up"
        hashes = prompt_hashes(token_ids, self.block_size)
        least = min(up, key=lambda r: (loads[r], r))
        best = max(up, key=lambda r: (matched(self.indexes[r], hashes), -loads[r], -r))
        if matched(self.indexes[best], hashes) == 0:
            rank, reason = least, "load"
        elif loads[best] - loads[least] > self.slack:
            rank, reason = least, "balance"
        else:
            rank, reason = best, "prefix"
        self.indexes[rank].placed(hashes)
        self.counts[rank][reason] += 1
        return rank, reason
