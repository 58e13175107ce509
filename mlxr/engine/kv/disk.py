"""The disk tier of the KV cache: one file per block under DIR/<layout key>/ (kv/block_file.py
says what a file holds), an SQLite index (least recently used first, bounded in bytes across
every layout in DIR), written by a thread of its own so the step loop never waits on a disk.
The index row is added after a file's rename. Where a pool of reader threads is asked for, a
prefix is read ahead by it (file reads and the CRC release the GIL). Pure Python (no torch).

Nothing in DIR is trusted (kv_disk_dir.py, kv_disk_index.py): an entry that is not a good block
file of this block, model and layout is skipped, counted by reason and its block recomputed; an
unusable index is rebuilt; an error of the writer thread is logged and counted, and it goes on."""
from __future__ import annotations

import errno
import logging
import queue
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from mlxr.engine.kv.block_file import BlockIdentity, BlockRejected, Layout, private_open, read_block_into, write_block
from mlxr.engine.kv.disk_dir import (layout_directory, private_directory, remove_block_file, seal_key,
                                     sweep_temporaries)
from mlxr.engine.kv.disk_index import connect, open_index
from mlxr.engine.kv.events import MEDIUM_DISK

log = logging.getLogger(__name__)

MAX_PENDING_BYTES = 512 << 20  # blocks queued for writing; past it new ones are dropped
READ_THREADS = 8  # the read-ahead pool where one is asked for (read_threads); none by default
# A write failing with these is the file system's, not one file's: disk writes turn off.
DISK_WIDE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


@dataclass
class DiskCounters:
    hits: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    skipped_files: int = 0  # refused when read (any reason): recomputed instead
    write_errors: int = 0  # any error of the writer thread (it goes on)
    dropped_writes: int = 0  # the writer was behind by MAX_PENDING_BYTES
    rejected: Counter = field(default_factory=Counter)  # skipped_files by BlockRejected.reason


# A batch to write: the blocks (hash, parent, tokens), their payload buffers (a callable, so the
# bytes are taken once the device copy is done), and what to wait on first.
WriteBatch = tuple[list[BlockIdentity], Callable[[], list[memoryview]], Callable[[], None] | None]


class DiskStore:
    def __init__(self, root: Path, layout: Layout, block_bytes: int, max_bytes: int,
                 read_threads: int | None = None) -> None:
        self.root, self.layout, self.block_bytes, self.max_bytes = Path(root), layout, block_bytes, max_bytes
        private_directory(self.root)
        self.dir = layout_directory(self.root, layout.key())
        self.key = seal_key(self.root)
        self.db_path = open_index(self.root)
        self.counters = DiskCounters()
        self.opener: Callable = private_open  # where files are opened for writing (tests inject a full disk)
        self.events = None  # kv/events.py's publisher: told of each block written and deleted (writer thread)
        self._lock = threading.Lock()
        self._resident: set[bytes] = set()
        self._pending: set[bytes] = set()
        self._pending_bytes = 0
        self.total_bytes = 0
        self.writes_enabled = max_bytes > 0
        self._load_index()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._writer, name="kv-disk-writer", daemon=True)
        self._thread.start()
        # No pool by default: with the CRC at memory speed, a 4,000-token prefix read on the
        # scheduler's thread alone beat 2-16 readers (bench/probes/kv_disk_threads.py: 2-core
        # EPYC 8.9 ms against 13.6 with two; the H100's 16-core host 25 ms against 29-40).
        threads = read_threads or 1
        self._reader = ThreadPoolExecutor(threads, thread_name_prefix="kv-disk-reader") if threads > 1 else None
        self._prefetched: dict[bytes, tuple[Future, memoryview]] = {}  # read ahead: h -> (read, its buffer)
        self._running: list[Future] = []  # read-ahead dropped but maybe still writing its buffer
        self._touched: list[bytes] = []  # read since the last settle(): marked used in one transaction

    # --- index --------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        return connect(self.db_path)

    def _load_index(self) -> None:
        sweep_temporaries(self.dir)
        db = self._connect()
        try:
            rows = db.execute("SELECT hash FROM blocks WHERE layout = ? ORDER BY last_used DESC",
                              (self.layout.key(),)).fetchall()
            self._by_recency = [bytes(h) for (h,) in rows]  # as the index stood at start
            self._resident = set(self._by_recency)
            self.total_bytes = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM blocks").fetchone()[0]
        finally:
            db.close()
        log.info("KV disk tier %s: %d blocks of this model's layout, %.1f MB in all", self.dir,
                 len(self._resident), self.total_bytes / 1e6)

    @property
    def num_blocks(self) -> int:
        return len(self._resident)

    def contains(self, h: bytes) -> bool:
        return h in self._resident

    def most_recent(self, limit: int) -> list[bytes]:
        """Up to limit blocks of this layout that the index held at start, most recently used first."""
        return [h for h in self._by_recency if h in self._resident][:max(0, limit)]

    def _path(self, h: bytes) -> Path:
        return self.dir / f"{h.hex()}.kvb"

    # --- reading (the scheduler's thread, read-ahead in the reader pool) ---------------------------
    @property
    def reads_ahead(self) -> bool:
        """Whether prefetch() starts anything (a reader pool was asked for)."""
        return self._reader is not None

    def prefetch(self, reads: list[tuple[bytes, memoryview]]) -> None:
        """Start reading and verifying these blocks in parallel, each straight into its buffer, for
        read() to take. Reads of an earlier prefetch that are not wanted any more are cancelled,
        or left to end where they started (their buffers are not reused before settle())."""
        if self._reader is None:
            return
        old, self._prefetched = self._prefetched, {}
        for h, into in reads:
            pending = old.pop(h, None)
            self._prefetched[h] = pending or (self._reader.submit(self._read_into, h, into), into)
        for future, _ in old.values():
            future.cancel()
        self._running.extend(future for future, _ in old.values())

    def settle(self) -> None:
        """No read-ahead writes into any buffer once this returns (the caller reuses them), and the
        blocks read so far are marked used in the index, in one transaction."""
        futures = [f for f, _ in self._prefetched.values()] + self._running
        self._prefetched, self._running = {}, []
        for future in futures:
            future.cancel()
        wait(futures)
        self._post_touches()

    def _post_touches(self) -> None:
        if self._touched:
            touched, self._touched = self._touched, []
            self._queue.put(("touch", touched))

    def read(self, h: bytes, into: memoryview | None = None) -> memoryview | None:
        """The block's verified payload (in `into`, or in the buffer it was read ahead into), or
        None (logged) when its file is unusable."""
        pending = self._prefetched.pop(h, None)
        if pending is None:
            if h not in self._resident:
                return None
            into = memoryview(bytearray(self.block_bytes)) if into is None else into
        try:
            if pending is None:
                self._read_into(h, into)
            else:
                future, into = pending
                future.result()
        except BlockRejected as e:
            log.warning("KV disk tier: skipping %s (%s: %s); the block is recomputed", self._path(h).name,
                        e.reason, e)
            self.counters.skipped_files += 1
            self.counters.rejected[e.reason] += 1
            self._forget(h)
            return None
        self.counters.hits += 1
        self.counters.bytes_read += self.block_bytes
        self._touched.append(h)
        return into

    def _read_into(self, h: bytes, into: memoryview) -> None:
        read_block_into(self._path(h), self.layout, h, into, self.key)

    def _forget(self, h: bytes) -> None:
        with self._lock:
            self._resident.discard(h)
        self._queue.put(("forget", h))

    # --- writing (queued here, done by the writer thread) --------------------------------------
    def wants(self, h: bytes) -> bool:
        return self.writes_enabled and h not in self._resident and h not in self._pending

    def submit(self, batch: WriteBatch) -> None:
        hashes = [block.hash for block in batch[0]]
        size = len(hashes) * self.block_bytes
        with self._lock:
            if self._pending_bytes + size > MAX_PENDING_BYTES:
                self.counters.dropped_writes += len(hashes)
                return
            self._pending_bytes += size
            self._pending.update(hashes)
        self._queue.put(("write", batch))

    def drain(self, timeout_s: float = 60.0) -> bool:
        """Wait until every queued write is on disk (tests, shutdown); False on timeout."""
        done = threading.Event()
        self._post_touches()
        self._queue.put(("mark", done))
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 8.0) -> None:
        self.settle()
        if self._reader is not None:
            self._reader.shutdown(wait=False, cancel_futures=True)
        self.drain(timeout_s)
        self._queue.put(("stop", None))
        self._thread.join(timeout_s)

    def _writer(self) -> None:
        db = self._connect()
        try:
            while True:
                kind, item = self._queue.get()
                if kind == "stop":
                    return
                try:
                    self._handle(db, kind, item)
                except Exception as e:  # noqa: BLE001 - the writer outlives any one error
                    self.counters.write_errors += 1
                    log.error("KV disk tier: the writer's %s failed (%s: %s); it goes on", kind, type(e).__name__, e)
                    db.rollback()
        finally:
            db.close()

    def _handle(self, db: sqlite3.Connection, kind: str, item) -> None:
        if kind == "mark":
            item.set()
        elif kind == "write":
            self._write_batch(db, *item)
        elif kind == "touch":
            now, key = time.time(), self.layout.key()
            db.executemany("UPDATE blocks SET last_used = ? WHERE layout = ? AND hash = ?",
                           [(now, key, h) for h in item])
            db.commit()
        elif kind == "forget":
            self._delete(db, [(self.layout.key(), item)])

    def _write_batch(self, db: sqlite3.Connection, blocks: list[BlockIdentity], payloads, wait) -> None:
        try:
            if wait is not None:
                wait()
            buffers = payloads()
            for block, buf in zip(blocks, buffers):
                if self.writes_enabled:
                    self._write_one(db, block, buf)
        finally:
            with self._lock:
                self._pending.difference_update(block.hash for block in blocks)
                self._pending_bytes -= len(blocks) * self.block_bytes
        self._evict(db)

    def _write_one(self, db: sqlite3.Connection, block: BlockIdentity, payload: memoryview) -> None:
        h, final = block.hash, self._path(block.hash)
        try:
            write_block(final, self.layout, block, payload, self.key, self.opener)
        except OSError as e:
            self.counters.write_errors += 1
            if e.errno in DISK_WIDE_ERRORS:
                self.writes_enabled = False
                log.error("KV disk tier: writing %s failed (%s); disk writes are off, the cache on disk "
                          "stays readable and nothing is lost", final.name, e)
            else:
                log.warning("KV disk tier: writing %s failed (%s); the block stays off the disk", final.name, e)
            return
        size = final.stat().st_size
        db.execute("INSERT OR REPLACE INTO blocks VALUES (?, ?, ?, ?)", (self.layout.key(), h, size, time.time()))
        db.commit()
        with self._lock:
            self._resident.add(h)
            self.total_bytes += size
        self.counters.bytes_written += len(payload)
        if self.events is not None:
            self.events.stored(h, block.parent, block.tokens, medium=MEDIUM_DISK)

    def _evict(self, db: sqlite3.Connection) -> None:
        """Least recently used files go, of any layout, until the directory is within its bound."""
        while self.total_bytes > self.max_bytes:
            rows = db.execute("SELECT layout, hash, bytes FROM blocks ORDER BY last_used LIMIT 64").fetchall()
            if not rows:
                return
            excess, doomed = self.total_bytes - self.max_bytes, []
            for layout, h, size in rows:
                if excess <= 0:
                    break
                doomed.append((layout, h))
                excess -= size
            self._delete(db, doomed)

    def _delete(self, db: sqlite3.Connection, rows: list[tuple[str, bytes]]) -> None:
        for layout, h in rows:
            h = bytes(h)
            # Only names this code makes: an index edited by hand cannot point a delete elsewhere.
            well_formed = isinstance(layout, str) and len(layout) == 32 and all(c in "0123456789abcdef" for c in layout)
            path = self.root / layout / f"{h.hex()}.kvb" if well_formed else None
            got = db.execute("SELECT bytes FROM blocks WHERE layout = ? AND hash = ?", (layout, h)).fetchone()
            db.execute("DELETE FROM blocks WHERE layout = ? AND hash = ?", (layout, h))
            if path is not None and (why := remove_block_file(path)) is not None:
                self.counters.write_errors += 1
                log.warning("KV disk tier: cannot remove %s (%s); it is left, out of the index", path, why)
            with self._lock:
                if got is not None:
                    self.total_bytes -= got[0]
                if layout == self.layout.key():
                    self._resident.discard(h)
            if self.events is not None and layout == self.layout.key():
                self.events.removed(h, MEDIUM_DISK)
        db.commit()
