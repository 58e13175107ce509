"""Data-parallel placement on its own: a replica's index follows its KV events (as the encoder
sends them, decoded by msgspec), a prompt goes to the replica holding its longest prefix, a
just-placed prompt draws its followers, load decides without a prefix, and a prefix holder
loaded past the slack yields to the least loaded replica."""
from __future__ import annotations

import msgspec

from mlxr.engine.frontend.dp_placement import Placement, prompt_hashes
from mlxr.engine.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

BLOCK = 16
ENCODE = msgspec.msgpack.Encoder().encode


def prompt(seed: int, n: int = 65) -> list[int]:
    return [(seed * 31 + 7 * i) % 1000 for i in range(n)]


def stored(hashes: list[int]) -> bytes:
    return ENCODE(EventBatch(1.0, [BlockStored(hashes, None, [0] * (BLOCK * len(hashes)), BLOCK, None, "GPU")], 0))


def test_the_replica_holding_the_longest_prefix_wins():
    p = Placement(3, BLOCK)
    hashes = prompt_hashes(prompt(1), BLOCK)
    assert len(hashes) == 4  # 65 tokens: 4 full blocks, the last token left to compute
    p.take_events(1, stored(hashes[:2]))
    p.take_events(2, stored(hashes[:3]))
    assert p.choose(prompt(1), [0, 0, 100]) == (2, "prefix")
    assert p.counts[2]["prefix"] == 1


def test_no_prefix_goes_by_load_and_a_placed_prompt_draws_its_followers():
    p = Placement(2, BLOCK)
    assert p.choose(prompt(2), [50, 10]) == (1, "load")
    assert p.choose(prompt(2, 80), [0, 10]) == (1, "prefix")  # same first blocks, not yet in any event


def test_an_overloaded_holder_yields():
    p = Placement(2, BLOCK, slack_tokens=100)
    p.take_events(0, stored(prompt_hashes(prompt(3), BLOCK)))
    assert p.choose(prompt(3), [101, 0]) == (1, "balance")
    assert p.choose(prompt(3), [100, 0])[1] in ("prefix",)


def test_removals_and_clears_forget_blocks():
    p = Placement(2, BLOCK)
    hashes = prompt_hashes(prompt(4), BLOCK)
    p.take_events(0, stored(hashes))
    p.take_events(0, ENCODE(EventBatch(2.0, [BlockRemoved(hashes[:1], "GPU")], 0)))
    assert p.choose(prompt(4), [0, 5]) == (0, "load")  # its first block is gone: nothing matches
    p.take_events(1, stored(hashes))
    p.take_events(1, ENCODE(EventBatch(3.0, [AllBlocksCleared()], 1)))
    assert not p.indexes[1].blocks and not p.indexes[1].recent


def test_down_replicas_are_skipped():
    p = Placement(2, BLOCK)
    p.take_events(0, stored(prompt_hashes(prompt(5), BLOCK)))
    assert p.choose(prompt(5), [None, 1000]) == (1, "load")
