"""The disk tier's read path: block files read (ahead, in parallel, or in turn) straight into
staging rows come back byte for byte; a file damaged in any way is still refused before use,
whichever path read it; a prefix longer than the staging rows recycles them; CPU copies leave
torch's thread count as they found it."""
from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest
import torch

import mlxr.engine.kv.staging as kv_staging
import mlxr.engine.kv.tiers as kv_tiers
from mlxr.engine.kv.staging import StagedRow
from mlxr.engine.kv.tiers import KVTiers
from kv_tier_blocks import (DEVICES, SIZE, block_bytes, disk_hash, disk_store, random_cache, scramble, sync,
                                 write_blocks)


def block_file(root: Path, b: int) -> Path:
    return next(root.glob(f"*/{disk_hash(b).hex()}.kvb"))


def flip_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x01
    path.write_bytes(bytes(data))


def append_byte(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\0")


def cut_last_byte(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1])


def restore(tiers: KVTiers, n: int, first_block: int, read_ahead: bool) -> list[object]:
    chain = [disk_hash(b) for b in range(n)]
    if read_ahead:
        tiers.prefetch(chain)
    sources = []
    for h in chain:
        source = tiers.lookup(h)
        if source is None:
            break  # as the block manager does: the chain stops at the first block no tier has
        tiers.load(source, first_block + len(sources))
        sources.append(source)
    tiers.flush()
    return sources


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("threads", [0, 3])
def test_blocks_read_into_rows_come_back_byte_for_byte(device, threads, tmp_path):
    kv = random_cache(device)
    want = write_blocks(kv, tmp_path, device, 5)
    tiers = KVTiers(kv, host_blocks=0, disk=disk_store(tmp_path, device, threads))
    scramble(kv, list(range(16)))
    sources = restore(tiers, 5, 8, read_ahead=True)
    sync(device)
    assert all(isinstance(s, StagedRow) for s in sources) and len(sources) == 5
    for b in range(5):
        assert torch.equal(block_bytes(kv, 8 + b), want[b]), f"block {b}"
    assert tiers.disk.counters.hits == 5 and tiers.disk.counters.bytes_read == 5 * SIZE
    tiers.close()


@pytest.mark.parametrize("threads", [0, 3])
@pytest.mark.parametrize("damage", [flip_payload_byte, append_byte, cut_last_byte])
def test_damaged_file_is_refused_whichever_path_reads_it(threads, damage, tmp_path, caplog):
    kv = random_cache("cpu")
    want = write_blocks(kv, tmp_path, "cpu", 5)
    bad = block_file(tmp_path, 3)
    damage(bad)
    tiers = KVTiers(kv, host_blocks=0, disk=disk_store(tmp_path, "cpu", threads))
    scramble(kv, list(range(16)))
    with caplog.at_level(logging.WARNING):
        sources = restore(tiers, 5, 8, read_ahead=True)
    assert len(sources) == 3 and tiers.disk.counters.skipped_files == 1
    assert any("skipping" in r.message and bad.name in r.message for r in caplog.records)
    for b in range(3):
        assert torch.equal(block_bytes(kv, 8 + b), want[b])
    assert (kv.layers[0][0][11] == -1.0).all()  # the refused block's bytes never reached the cache
    tiers.disk.drain()
    assert not tiers.disk.contains(disk_hash(3))
    tiers.close()


@pytest.mark.parametrize("threads", [0, 2])
def test_prefix_longer_than_the_staging_rows_recycles_them(threads, tmp_path, monkeypatch):
    monkeypatch.setattr(kv_tiers, "STAGING_BYTES", 2 * SIZE)  # two rows for a prefix of five
    kv = random_cache("cpu")
    want = write_blocks(kv, tmp_path, "cpu", 5)
    tiers = KVTiers(kv, host_blocks=0, disk=disk_store(tmp_path, "cpu", threads))
    assert tiers.staging.data.shape[0] == 2
    scramble(kv, list(range(16)))
    assert len(restore(tiers, 5, 8, read_ahead=True)) == 5
    for b in range(5):
        assert torch.equal(block_bytes(kv, 8 + b), want[b]), f"block {b}"
    tiers.close()


def test_rows_of_an_unused_read_ahead_are_freed_by_the_next_flush(tmp_path):
    kv = random_cache("cpu")
    write_blocks(kv, tmp_path, "cpu", 4)
    flip_payload_byte(block_file(tmp_path, 0))  # the chain stops at once: nothing to load
    tiers = KVTiers(kv, host_blocks=0, disk=disk_store(tmp_path, "cpu", 2))
    assert restore(tiers, 4, 8, read_ahead=True) == []
    assert tiers.staging.taken == 0 and not tiers._row_of and not tiers.disk._prefetched
    tiers.close()


def test_reads_mark_blocks_used_in_the_index(tmp_path):
    kv = random_cache("cpu")
    write_blocks(kv, tmp_path, "cpu", 4)
    db = sqlite3.connect(tmp_path / "index.sqlite")
    before = dict(db.execute("SELECT hash, last_used FROM blocks").fetchall())
    tiers = KVTiers(kv, host_blocks=0, disk=disk_store(tmp_path, "cpu", 2))
    restore(tiers, 2, 8, read_ahead=True)
    tiers.disk.drain()
    after = dict(db.execute("SELECT hash, last_used FROM blocks").fetchall())
    assert [after[disk_hash(b)] > before[disk_hash(b)] for b in range(4)] == [True, True, False, False]
    tiers.close()
    db.close()


def test_cpu_copies_leave_the_thread_count_as_found(tmp_path):
    kv = random_cache("cpu")
    write_blocks(kv, tmp_path, "cpu", 2)
    tiers = KVTiers(kv, host_blocks=0, disk=disk_store(tmp_path, "cpu", 0))
    threads = torch.get_num_threads()
    seen = []
    with kv_staging.one_thread():
        seen.append(torch.get_num_threads())
    assert seen == [1] and torch.get_num_threads() == threads
    restore(tiers, 2, 8, read_ahead=False)
    assert torch.get_num_threads() == threads
    tiers.close()


def test_zlib_ng_crc_is_zlibs_and_first_format_files_are_foreign(tmp_path):
    """The CRC-32 is zlib-ng's since 2026-11-25, the same number as the standard library's zlib
    for every length (odd tails too); a file of the first format (MLXRKV01, before tokens and a
    seal were in the header), whatever its CRC, is refused as foreign, not read."""
    import json
    import struct
    import zlib
    from dataclasses import asdict

    from mlxr.engine.kv.block_file import BlockRejected, Layout, crc32, read_block_into

    gen = torch.Generator().manual_seed(0)
    for n in (1, 31, 4096, 360_448 + 7):
        data = memoryview(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen).numpy().tobytes())
        assert crc32(data) == zlib.crc32(data), n
    layout = Layout("digest", "torch.float32", 16, 2, 2, 8, "cpu")
    payload = memoryview(torch.randn(512, generator=gen).numpy().tobytes())
    h = bytes(32)
    header = json.dumps({**asdict(layout), "hash": h.hex(), "bytes": len(payload), "crc32": zlib.crc32(payload)}).encode()
    path = tmp_path / "old.kvb"
    path.write_bytes(b"MLXRKV01" + struct.pack("<I", len(header)) + header + bytes(payload))
    with pytest.raises(BlockRejected) as refused:
        read_block_into(path, layout, h, memoryview(bytearray(len(payload))), key=bytes(32))
    assert refused.value.reason == "foreign"
