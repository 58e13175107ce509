"""Block manager: refcounts, prefix caching, copy-on-write, LRU eviction (pure Python)."""
from mlxr.engine.records import EngineCoreRequest
from mlxr.engine.sched.block_manager import BlockManager
from mlxr.engine.sched.request import Request
from mlxr.types import SamplingParams

BS = 4


def seq(tokens, sid=0):
    return Request(EngineCoreRequest(f"r{sid}", list(tokens), SamplingParams(), 100, [], 0.0))


def run_prompt(bm: BlockManager, s: Request) -> None:
    """Allocate and 'compute' the whole prompt, as the scheduler + runner would."""
    s.num_computed_tokens = bm.match_prefix(s)
    bm.allocate(s, s.num_tokens)
    s.num_computed_tokens = s.num_tokens
    bm.commit_full_blocks(s)


def test_allocate_and_free_return_every_block():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    s = seq(range(10))
    bm.allocate(s, 10)
    assert len(s.block_table) == 3 and bm.usage().used == 3
    bm.free(s)
    assert bm.usage().used == 0 and bm.usage().free == 8
    assert all(r == 0 for r in bm.ref_counts)


def test_prefix_hit_reuses_full_blocks_only():
    bm = BlockManager(16, BS)
    a = seq(range(10), 0)
    run_prompt(bm, a)
    b = seq(list(range(10)) + [99, 98], 1)
    hit = bm.match_prefix(b)
    assert hit == 8  # two full blocks; the partial third block is never shared
    assert b.block_table == a.block_table[:2]
    assert bm.ref_counts[a.block_table[0]] == 2


def test_full_prompt_hit_leaves_one_token_to_compute():
    bm = BlockManager(16, BS)
    run_prompt(bm, seq(range(8), 0))
    again = seq(range(8), 1)
    assert bm.match_prefix(again) == 4


def test_freed_prefix_stays_cached_until_evicted_lru():
    bm = BlockManager(4, BS)
    a = seq(range(8), 0)
    run_prompt(bm, a)
    bm.free(a)
    assert bm.usage().cached == 2 and bm.usage().used == 0
    b = seq(list(range(8)) + [7], 1)
    assert bm.match_prefix(b) == 8  # reused after free
    bm.free(b)
    # Filling the cache with other tokens evicts the cached blocks.
    c = seq(range(100, 116), 2)
    bm.allocate(c, 16)
    assert bm.usage().cached == 0
    assert bm.match_prefix(seq(list(range(8)) + [7], 3)) == 0


def test_copy_on_write_only_for_shared_partial_block():
    bm = BlockManager(16, BS)
    parent = seq(range(6), 0)
    run_prompt(bm, parent)
    parent.token_ids.append(50)
    child = seq(parent.token_ids, 1)
    child.num_computed_tokens = parent.num_computed_tokens
    bm.fork(parent, child)
    assert bm.new_blocks_needed(parent, 7) == 1  # the shared partial block must be copied
    copies = bm.allocate(parent, 7)
    assert len(copies) == 1 and copies[0][0] == child.block_table[1]
    assert parent.block_table[0] == child.block_table[0]  # full block still shared
    assert bm.allocate(child, 7) == []  # now the child owns its block alone
    bm.free(parent)
    bm.free(child)
    assert all(r == 0 for r in bm.ref_counts)


def test_no_copy_when_fork_is_block_aligned():
    bm = BlockManager(16, BS)
    parent = seq(range(8), 0)
    run_prompt(bm, parent)
    parent.token_ids.append(1)
    child = seq(parent.token_ids, 1)
    child.num_computed_tokens = 8
    bm.fork(parent, child)
    assert bm.allocate(parent, 9) == [] and bm.allocate(child, 9) == []
    assert parent.block_table[2] != child.block_table[2]


def test_block_hashes_are_sha256_chained():
    import hashlib
    from array import array

    from mlxr.engine.sched.block_manager import block_hash

    first = block_hash(None, (1, 2, 3, 4))
    assert first == hashlib.sha256(array("q", [1, 2, 3, 4]).tobytes()).digest()
    assert block_hash(first, (5, 6, 7, 8)) != block_hash(None, (5, 6, 7, 8))


def _cached_free_by_count(bm: BlockManager) -> int:
    return sum(1 for b in bm.free_blocks if b in bm.hash_of)


def test_cached_count_follows_every_change_of_the_free_blocks():
    """usage().cached is kept as blocks change (the core reads it every stats snapshot): it
    equals a count over the free blocks after each of many random admissions, forks, frees,
    evictions, embeddings' blocks and adopted prefixes."""
    import random

    rnd = random.Random(7)
    bm = BlockManager(24, BS)
    live: list[Request] = []
    for i in range(400):
        op = rnd.random()
        if op < 0.4:
            # prompts from a few shared prefixes, so blocks are reused, shared and evicted
            s = seq([rnd.randrange(3)] * rnd.randrange(1, 6) + [rnd.randrange(50) for _ in range(rnd.randrange(1, 9))], i)
            need = bm.blocks_for(s.num_tokens)
            if bm.can_allocate(need):
                run_prompt(bm, s)
                live.append(s)
        elif op < 0.5 and live:
            child = seq([], i)
            parent = rnd.choice(live)
            child.token_ids = list(parent.token_ids)
            bm.fork(parent, child)
            child.num_computed_tokens = parent.num_computed_tokens
            live.append(child)
        elif op < 0.8 and live:
            bm.free(live.pop(rnd.randrange(len(live))))
        elif op < 0.9 and bm.can_allocate(2):
            bm.release_blocks(bm.take_blocks(2))
        else:
            bm.adopt(bytes([i % 256, i // 256]) * 16)
        assert bm.usage().cached == _cached_free_by_count(bm), i
    assert bm.usage().cached > 0


class _NoWalk(dict):
    def __iter__(self):
        raise AssertionError("usage() walked the free blocks")


def test_usage_reads_no_free_block():
    """A stats snapshot costs the same at any cache size: usage() never walks the free blocks
    (it did, ~4 ms a snapshot at 65k blocks, a stall of the core loop every 100 ms)."""
    bm = BlockManager(64, BS)
    a = seq(range(12))
    run_prompt(bm, a)
    bm.free(a)
    walked = _NoWalk(bm.free_blocks)
    bm.free_blocks, kept = walked, bm.free_blocks
    try:
        usage = bm.usage()
    finally:
        bm.free_blocks = kept
    assert (usage.cached, usage.free, usage.used) == (3, 64, 0)


def test_caller_owned_blocks_join_the_prefix_cache_once_committed():
    """A prompt computed in take_blocks' blocks (scored or embedded between steps) leaves its
    full blocks for the request that follows with the same prompt."""
    for caching in (True, False):
        bm = BlockManager(16, BS, enable_prefix_caching=caching)
        blocks = bm.take_blocks(3)
        bm.commit_blocks(blocks, list(range(10)))
        bm.release_blocks(blocks)
        assert bm.usage().cached == (2 if caching else 0)  # the partial third block is not published
        s = seq(range(11))
        assert bm.match_prefix(s) == (8 if caching else 0)
        assert s.block_table == (blocks[:2] if caching else [])
