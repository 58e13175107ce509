"""A block file and the disk store under hostile entries, below the engine: every refusal is a
BlockRejected with its reason and returns in bounded time (a FIFO is never read, a header nested
2,000 deep never reaches json), a renamed file fails its identity check, and an error of the
writer thread is counted while the thread goes on."""
from __future__ import annotations

import json
import os
import threading

import pytest
import torch

import kv_dir_damage as damage
from mlxr.engine.kv.block_file import (BlockIdentity, BlockRejected, Layout, header_limit, read_block_into,
                                       write_block)
from mlxr.engine.kv.disk_dir import seal_key
from kv_tier_blocks import SIZE, disk_block, disk_hash, disk_store, random_cache, write_blocks

LAYOUT = Layout("digest", "float32", 4, 2, 2, 8, "cpu")
KEY = bytes(range(32))


def payload(seed: int = 0, n: int = 256) -> memoryview:
    return memoryview(torch.randn(n, generator=torch.Generator().manual_seed(seed)).numpy().tobytes())


def written(tmp_path, b: int = 0, key: bytes = KEY):
    block = disk_block(b)
    path = tmp_path / f"{block.hash.hex()}.kvb"
    data = payload(b)
    write_block(path, LAYOUT, block, data, key)
    return path, block, data


def refusal(path, block: BlockIdentity, size: int, key: bytes = KEY, timeout_s: float = 10.0) -> str:
    """The reason read_block_into refuses path, read on a thread that must finish in timeout_s."""
    out: dict[str, BaseException] = {}

    def read() -> None:
        try:
            read_block_into(path, LAYOUT, block.hash, memoryview(bytearray(size)), key)
        except BaseException as e:  # noqa: BLE001 - inspected below
            out["error"] = e

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "the read blocked"
    assert isinstance(out.get("error"), BlockRejected), out
    return out["error"].reason


def test_a_written_block_reads_back(tmp_path):
    path, block, data = written(tmp_path)
    into = memoryview(bytearray(len(data)))
    read_block_into(path, LAYOUT, block.hash, into, KEY)
    assert bytes(into) == bytes(data)
    assert os.stat(path).st_mode & 0o077 == 0


def test_fifo_is_refused_without_blocking(tmp_path):
    path, block, data = written(tmp_path)
    damage.fifo(path)
    assert refusal(path, block, len(data)) == "not_regular"


def test_header_nested_2000_deep_is_refused_before_json(tmp_path):
    path, block, data = written(tmp_path)
    damage.deep_header(path)
    assert refusal(path, block, len(data)) == "corrupt"


def test_header_longer_than_its_bound_is_refused_unread(tmp_path):
    path, block, data = written(tmp_path)
    header, body = damage.read_header(path)
    header["padding"] = "x" * header_limit(LAYOUT)
    damage.write_with_header(path, path.read_bytes()[:8], json.dumps(header).encode(), body)
    assert refusal(path, block, len(data)) == "corrupt"


@pytest.mark.parametrize("make", [damage.directory, damage.symlink_outside, damage.missing, damage.truncated])
def test_other_entries_are_refused_by_reason(tmp_path, make):
    path, block, data = written(tmp_path)
    make(path)
    want = {"directory": "not_regular", "symlink_outside": "symlink", "missing": "missing", "truncated": "truncated"}
    assert refusal(path, block, len(data)) == want[make.__name__]


def test_symlink_to_a_good_block_of_its_own_name_is_refused(tmp_path):
    path, block, data = written(tmp_path)
    elsewhere = tmp_path / "elsewhere.kvb"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)
    assert refusal(path, block, len(data)) == "symlink"


def test_renamed_block_fails_its_tokens(tmp_path):
    """Another block's file, only its header's hash changed to the target's (the T13 forgery):
    its tokens and parent do not hash to the name."""
    source, _, data = written(tmp_path, 1)
    target = disk_block(2)
    path = tmp_path / f"{target.hash.hex()}.kvb"
    header, body = damage.read_header(source)
    header["hash"] = target.hash.hex()
    damage.write_with_header(path, source.read_bytes()[:8], json.dumps(header).encode(), body)
    assert refusal(path, target, len(data)) == "forged"


def test_forged_identity_fails_its_seal(tmp_path):
    """Another block's payload and CRC under the target's name, tokens and parent: only the seal
    (keyed, over the CRC too) tells."""
    source, _, data = written(tmp_path, 1)
    target = disk_block(2)
    path = tmp_path / f"{target.hash.hex()}.kvb"
    damage.forge(source, path, target.parent, target.tokens)
    assert refusal(path, target, len(data)) == "forged"
    good, _, _ = written(tmp_path, 2)
    assert refusal(good, target, len(data), key=bytes(32)) == "forged"  # sealed under another key


def test_seal_key_is_made_once_and_private(tmp_path):
    key = seal_key(tmp_path)
    assert len(key) == 32 and seal_key(tmp_path) == key
    assert (tmp_path / "seal.key").stat().st_mode & 0o077 == 0
    (tmp_path / "seal.key").write_bytes(b"short")
    assert seal_key(tmp_path) != key


def test_writer_outlives_an_entry_it_cannot_remove_or_write(tmp_path):
    """A directory where a block file was: the read refuses it, the writer's unlink fails, the
    rewrite of the recomputed block fails, and the writer still drains and writes the next blocks."""
    kv = random_cache("cpu")
    write_blocks(kv, tmp_path, "cpu", 2)
    store = disk_store(tmp_path, "cpu")
    bad = store._path(disk_hash(0))
    damage.directory(bad)
    assert store.read(disk_hash(0)) is None and store.counters.rejected["not_regular"] == 1
    assert store.drain(10)
    assert not store.contains(disk_hash(0)) and store.counters.write_errors == 1
    rows = [memoryview(bytearray(SIZE)) for _ in range(3)]
    store.submit(([disk_block(0), disk_block(2), disk_block(3)], lambda: rows, None))
    assert store.drain(10) and store.writes_enabled
    assert store.contains(disk_hash(2)) and store.contains(disk_hash(3)) and store.counters.write_errors == 2
    store.close()


def test_writer_outlives_an_index_error(tmp_path):
    store = disk_store(tmp_path, "cpu")
    store._queue.put(("touch", ["not bytes", object()]))  # sqlite cannot bind an object
    assert store.drain(10) and store.counters.write_errors == 1
    rows = [memoryview(bytearray(SIZE))]
    store.submit(([disk_block(0)], lambda: rows, None))
    assert store.drain(10) and store.contains(disk_hash(0))
    store.close()


def test_any_damage_to_a_header_is_a_rejection_or_the_block(tmp_path):
    """2,000 seeded mutations of a real file's first 700 bytes (bytes flipped, cut, replaced by
    JSON punctuation): each read ends in a BlockRejected or gives the block's own bytes."""
    import random

    path, block, data = written(tmp_path)
    original = path.read_bytes()
    rng = random.Random(0)
    for _ in range(2000):
        raw = bytearray(original)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(700)
            raw[i] = rng.choice(b'[]{}",:-0129e\\\x00\xff') if rng.random() < 0.7 else rng.randrange(256)
        if rng.random() < 0.1:
            raw = raw[: rng.randrange(len(raw))]
        path.write_bytes(bytes(raw))
        into = memoryview(bytearray(len(data)))
        try:
            read_block_into(path, LAYOUT, block.hash, into, KEY)
        except BlockRejected:
            continue
        assert bytes(into) == bytes(data)


def test_store_starts_past_odd_temporaries_and_malformed_index_rows(tmp_path):
    """A name ending in .tmp without a writer's pid, a directory and a FIFO named like a dead
    writer's temporary, and index rows of the wrong types: the store starts, removes the FIFO
    only (a non-directory of its own naming), drops the rows, and reads its blocks."""
    import sqlite3

    kv = random_cache("cpu")
    write_blocks(kv, tmp_path, "cpu", 2)
    layout_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    (layout_dir / "stray.tmp").write_bytes(b"x")
    (layout_dir / "a.kvb.999999999.tmp").mkdir()
    os.mkfifo(layout_dir / "b.kvb.999999998.tmp")
    db = sqlite3.connect(tmp_path / "index.sqlite")
    db.execute("INSERT INTO blocks VALUES (?, ?, ?, ?)", (layout_dir.name, "text, not a hash", "big", "now"))
    db.execute("INSERT INTO blocks VALUES (?, ?, ?, ?)", (7, b"\0" * 32, 10, 0.0))
    db.commit()
    db.close()
    store = disk_store(tmp_path, "cpu")
    try:
        assert store.num_blocks == 2 and store.total_bytes > 0
        assert all(store.read(disk_hash(b)) is not None for b in range(2))
        assert sorted(p.name for p in layout_dir.glob("*.tmp")) == ["a.kvb.999999999.tmp", "stray.tmp"]  # not ours
    finally:
        store.close()
