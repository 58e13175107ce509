"""The KV tiers' batched copies: the same bytes come back as were saved (every layer, K and V),
in one transfer per run of host slots, whatever order the block manager queued the copies in."""
from __future__ import annotations

import random

import pytest
import torch

from kv_tier_blocks import BLOCK_SIZE, DEVICES, block_bytes, disk_hash, disk_store, random_cache, scramble, sync, write_blocks
from mlxr.engine.kv.tier_copies import plan, runs
from mlxr.engine.kv.tiers import KVTiers
from mlxr.engine.records import EngineCoreRequest
from mlxr.engine.sched.block_manager import BlockManager
from mlxr.engine.sched.request import Request
from mlxr.types import SamplingParams


@pytest.mark.parametrize("device", DEVICES)
def test_saved_blocks_come_back_byte_for_byte_in_two_transfers(device):
    kv = random_cache(device)
    tiers = KVTiers(kv, host_blocks=8, disk=None)
    saved = {b: block_bytes(kv, b) for b in range(6)}
    for b in range(6):
        tiers.evicted(bytes([b]), b)
    tiers.flush()
    scramble(kv, list(range(16)))
    targets = [15, 3, 9, 0, 12, 7]  # anywhere, in any order
    for b, target in zip(range(6), targets):
        tiers.load(tiers.lookup(bytes([b])), target)
    tiers.flush()
    sync(device)
    for b, target in zip(range(6), targets):
        assert torch.equal(block_bytes(kv, target), saved[b])
    # Six blocks in six consecutive slots: one transfer out, one back (one per block before).
    assert tiers.host_counters.copy_calls == 2
    assert tiers.host_counters.bytes_written == 6 * tiers.block_bytes  # each block counted once


@pytest.mark.parametrize("device", DEVICES)
def test_interleaved_evict_and_load_run_as_one_phase(device):
    """What a prefix hit after churn queues: evict the block's cached prefix, load the hit into it,
    block after block. Each evicted prefix is saved before the load overwrites its block."""
    kv = random_cache(device)
    tiers = KVTiers(kv, host_blocks=16, disk=None)
    prompt = {b: block_bytes(kv, b) for b in range(4)}
    for b in range(4):
        tiers.evicted(b"prompt%d" % b, b)
    tiers.flush()
    churn = {b: block_bytes(kv, b) for b in range(4, 8)}
    for b in range(4):
        tiers.evicted(b"churn%d" % b, 4 + b)
        tiers.load(tiers.lookup(b"prompt%d" % b), 4 + b)
    assert len(plan(tiers._ops)) == 1
    tiers.flush()
    sync(device)
    for b in range(4):
        assert torch.equal(block_bytes(kv, 4 + b), prompt[b])
    scramble(kv, list(range(16)))
    for b in range(4):
        tiers.load(tiers.lookup(b"churn%d" % b), 8 + b)
    tiers.flush()
    sync(device)
    for b in range(4):
        assert torch.equal(block_bytes(kv, 8 + b), churn[4 + b])


def request(tokens: list[int]) -> Request:
    return Request(EngineCoreRequest("r", tokens, SamplingParams(), 100, [], 0.0))


@pytest.mark.parametrize("device", DEVICES)
def test_partial_hit_device_then_host_then_miss(device):
    """A prefix whose head is still on the device, whose next blocks come from host memory, and
    whose next block is nowhere: the chain is served up to the miss, each block's own bytes."""
    kv = random_cache(device, num_blocks=8)
    bm = BlockManager(8, BLOCK_SIZE)
    bm.tiers = tiers = KVTiers(kv, host_blocks=2, disk=None)
    tokens = list(range(100, 129))  # 7 full blocks and one token
    first = request(tokens[:28])
    bm.allocate(first, 28)
    first.num_computed_tokens = 28
    bm.commit_full_blocks(first)
    original = {i: block_bytes(kv, b) for i, b in enumerate(first.block_table)}
    bm.free(first)  # tail blocks first in the free order: evicted first
    taken = bm.take_blocks(4)  # the free block, then blocks 6, 5, 4 of the prompt
    tiers.flush()  # blocks 6 and 5 went to host memory, then block 4 took block 6's slot
    scramble(kv, taken)
    bm.release_blocks(taken)
    second = request(tokens)
    assert bm.match_prefix(second) == 6 * BLOCK_SIZE
    tiers.flush()
    sync(device)
    assert tiers.host_counters.hits == 2
    for i, b in enumerate(second.block_table):
        assert torch.equal(block_bytes(kv, b), original[i]), f"block {i}"


@pytest.mark.parametrize("device", DEVICES)
def test_host_and_disk_sources_load_together(device, tmp_path):
    kv = random_cache(device)
    write_blocks(kv, tmp_path, device, 3)
    want = {b: block_bytes(kv, b) for b in range(6)}
    tiers = KVTiers(kv, host_blocks=4, disk=disk_store(tmp_path, device))  # a restart
    for b in range(3, 6):
        tiers.evicted(b"host%d" % b, b)
    tiers.flush()
    scramble(kv, list(range(16)))
    sources = [tiers.lookup(disk_hash(b)) for b in range(3)] + [tiers.lookup(b"host%d" % b) for b in range(3, 6)]
    assert all(s is not None for s in sources)
    for b, source in enumerate(sources):
        tiers.load(source, 10 + b)
    tiers.flush()
    sync(device)
    for b in range(6):
        assert torch.equal(block_bytes(kv, 10 + b), want[b]), f"block {b}"
    tiers.close()


def sequential(ops: list[tuple], device: dict, host: dict) -> None:
    """The meaning of the queued copies: each in turn."""
    for kind, a, b in ops:
        if kind == "save":
            host[b] = device[a]
        elif kind == "persist":
            host[("disk", a)] = device[b]
        else:
            device[b] = host[a] if isinstance(a, int) else a


def phased(ops: list[tuple], device: dict, host: dict) -> None:
    """The same copies as flush runs them: per phase, saves, persists, then loads."""
    for phase in plan(ops):
        reads = [device[block] for block, _ in phase.saves] + [device[block] for _, block in phase.persists]
        for (_, slot), value in zip(phase.saves, reads):
            host[slot] = value
        for (h, _), value in zip(phase.persists, reads[len(phase.saves):]):
            host[("disk", h)] = value
        loaded = [host[src] if isinstance(src, int) else src for src, _ in phase.loads]
        for (_, block), value in zip(phase.loads, loaded):
            device[block] = value


def test_plan_keeps_the_meaning_of_any_queue():
    """Random queues over few blocks and slots (so copies collide): phases give the same result
    as running the copies one by one, in fewer phases than copies."""
    rng = random.Random(0)
    fewer = 0
    for trial in range(500):
        ops = []
        for i in range(rng.randint(1, 24)):
            kind = rng.choice(["save", "save", "load", "load", "persist"])
            if kind == "save":
                ops.append(("save", rng.randrange(4), rng.randrange(4)))
            elif kind == "persist":
                ops.append(("persist", b"h%d" % i, rng.randrange(4)))
            else:
                src = rng.randrange(4) if rng.random() < 0.7 else f"payload{i}"
                ops.append(("load", src, rng.randrange(4)))
        start_dev = {b: f"d{b}" for b in range(4)}
        start_host = {s: f"h{s}" for s in range(4)}
        want_dev, want_host, got_dev, got_host = dict(start_dev), dict(start_host), dict(start_dev), dict(start_host)
        sequential(ops, want_dev, want_host)
        phased(ops, got_dev, got_host)
        assert (got_dev, got_host) == (want_dev, want_host), ops
        fewer += len(plan(ops)) < len(ops)
    assert fewer > 400


def test_runs_of_consecutive_indices():
    assert runs([]) == []
    assert runs([3, 4, 5, 9, 10, 12]) == [(0, 3, 3), (3, 9, 2), (5, 12, 1)]


def test_disk_chain_is_read_ahead_up_to_its_first_gap(tmp_path):
    """prefetch reads a chain's disk blocks in parallel (files can go once read), stopping at the
    first block that no tier has; lookups then take what was read."""
    kv = random_cache("cpu")
    want = write_blocks(kv, tmp_path, "cpu", 5)
    tiers = KVTiers(kv, host_blocks=0, disk=disk_store(tmp_path, "cpu", read_threads=2))
    chain = [disk_hash(0), disk_hash(1), disk_hash(2), b"nowhere", disk_hash(3)]
    tiers.prefetch(chain)
    assert set(tiers.disk._prefetched) == {disk_hash(0), disk_hash(1), disk_hash(2)}
    for future, _ in tiers.disk._prefetched.values():
        future.result()
    for path in tmp_path.glob("*/*.kvb"):
        path.unlink()
    sources = [tiers.lookup(h) for h in chain[:3]]
    assert tiers.lookup(disk_hash(3)) is None and tiers.disk.counters.skipped_files == 1  # not read ahead
    scramble(kv, list(range(16)))
    for b, source in enumerate(sources):
        tiers.load(source, 8 + b)
    tiers.flush()
    for b in range(3):
        assert torch.equal(block_bytes(kv, 8 + b), want[b])
    tiers.close()


@pytest.mark.gpu
def test_cuda_restore_with_evictions_never_syncs_the_host():
    """The step path's copies queue work and return: CUDA's sync debug mode raises on anything
    that would make the host wait (a pageable copy of block ids did, before)."""
    kv = random_cache("cuda")
    tiers = KVTiers(kv, host_blocks=16, disk=None)
    prompt = {b: block_bytes(kv, b) for b in range(4)}
    for b in range(4):
        tiers.evicted(b"prompt%d" % b, b)
    tiers.flush()  # first use: the pinned allocations are made here
    for b in range(4):
        tiers.evicted(b"churn%d" % b, 4 + b)
        tiers.load(tiers.lookup(b"prompt%d" % b), 4 + b)
    torch.cuda.set_sync_debug_mode("error")
    try:
        tiers.flush()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    for b in range(4):
        assert torch.equal(block_bytes(kv, 4 + b), prompt[b])


@pytest.mark.parametrize("device", DEVICES)
def test_loads_wait_for_the_saves_of_their_slots_across_flushes(device):
    """A load reads a slot saved two flushes before, after a flush whose loads read other slots
    (on CUDA those did not wait for that save: the later load still must), and a load reads a
    slot saved in its own flush, beside other saves it need not wait for."""
    kv = random_cache(device)
    tiers = KVTiers(kv, host_blocks=12, disk=None)
    want = {b: block_bytes(kv, b) for b in range(6)}
    tiers.evicted(b"a", 0)
    tiers.flush()
    tiers.evicted(b"b", 1)
    tiers.load(tiers.lookup(b"a"), 8)  # reads a's slot only
    tiers.flush()
    tiers.evicted(b"c", 2)
    tiers.evicted(b"d", 3)
    tiers.load(tiers.lookup(b"b"), 9)  # b's save was two flushes ago, never waited for
    tiers.load(tiers.lookup(b"c"), 10)  # c's save is in this very flush
    tiers.flush()
    sync(device)
    assert torch.equal(block_bytes(kv, 8), want[0])
    assert torch.equal(block_bytes(kv, 9), want[1])
    assert torch.equal(block_bytes(kv, 10), want[2])
