"""The disk tier of the KV cache: one file per block under DIR/<layout key>/, an SQLite index
(least recently used first, bounded in bytes across every layout in DIR), written by a thread
of its own so the step loop never waits on a disk.

A file is MAGIC, a 4-byte header length, a JSON header (model digest and cache layout, block
hash, payload length, CRC-32) and the raw tensor bytes: nothing in it is executed or unpickled.
Writes go to a temporary name, are fsynced and renamed, so a process killed mid-write leaves
the whole file or none; the index row is added after the rename. A read checks the header and
the file's size, reads the payload straight into the caller's buffer (a pinned staging row on
CUDA) and checks its CRC-32 there; where a pool of reader threads is asked for, a prefix is
read ahead by it (file reads and the CRC release the GIL). Pure Python (no torch)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import sqlite3
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path

# zlib-ng's CRC-32 gives zlib's values with SIMD: the H100 host's zlib 1.3 checked 1.9 GB/s, 52 ms
# of a 4,000-token TinyLlama prefix; zlib-ng runs 37 GB/s on an EPYC core (releasing the GIL too).
from zlib_ng.zlib_ng import crc32

log = logging.getLogger(__name__)

MAGIC = b"MLXRKV01"
HEADER_MAX = 4096
MAX_PENDING_BYTES = 512 << 20  # blocks queued for writing; past it new ones are dropped
READ_THREADS = 8  # the read-ahead pool where one is asked for (read_threads); none by default


def _alive(pid: str) -> bool:
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Layout:
    """What a block's bytes mean: a block is only reused by the same model laid out the same way."""

    model_digest: str
    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    device_type: str  # KV computed on another device differs in its last bits

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:32]


@dataclass
class DiskCounters:
    hits: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    skipped_files: int = 0  # corrupt, truncated or mismatched: recomputed instead
    write_errors: int = 0
    dropped_writes: int = 0  # the writer was behind by MAX_PENDING_BYTES


# A batch to write: the blocks' hashes, their payload buffers (a callable, so the bytes are taken
# once the device copy is done), and what to wait on first.
WriteBatch = tuple[list[bytes], Callable[[], list[memoryview]], Callable[[], None] | None]


class DiskStore:
    def __init__(self, root: Path, layout: Layout, block_bytes: int, max_bytes: int,
                 read_threads: int | None = None) -> None:
        self.root, self.layout, self.block_bytes, self.max_bytes = Path(root), layout, block_bytes, max_bytes
        self.dir = self.root / layout.key()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.db_path = self.root / "index.sqlite"
        self.counters = DiskCounters()
        self.opener: Callable = open  # where files are opened for writing (tests inject a full disk)
        self._header = asdict(layout)
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
        db = sqlite3.connect(self.db_path, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE IF NOT EXISTS blocks (layout TEXT, hash BLOB, bytes INTEGER, "
                   "last_used REAL, PRIMARY KEY (layout, hash))")
        return db

    def _load_index(self) -> None:
        for tmp in self.dir.glob("*.tmp"):  # left by a process killed mid-write
            if not _alive(tmp.suffixes[-2].lstrip(".")):  # another live server may share the directory
                tmp.unlink(missing_ok=True)
        db = self._connect()
        try:
            rows = db.execute("SELECT hash FROM blocks WHERE layout = ?", (self.layout.key(),)).fetchall()
            self._resident = {bytes(h) for (h,) in rows}
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

    def _path(self, h: bytes) -> Path:
        return self.dir / f"{h.hex()}.kvb"

    # --- reading (the scheduler's thread, read-ahead in the reader pool) ---------------------------
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
        except (OSError, ValueError) as e:
            log.warning("KV disk tier: skipping %s (%s); the block is recomputed", self._path(h).name, e)
            self.counters.skipped_files += 1
            self._forget(h)
            return None
        self.counters.hits += 1
        self.counters.bytes_read += self.block_bytes
        self._touched.append(h)
        return into

    def _read_into(self, h: bytes, into: memoryview) -> None:
        """Verify the file's header and size, read its payload straight into `into` (no copy of
        it in between), then check its CRC-32 there; raises ValueError or OSError."""
        with open(self._path(h), "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            start, crc = self._check_header(h, f.read(len(MAGIC) + 4 + HEADER_MAX))
            if size != start + self.block_bytes:
                raise ValueError(f"file of {size} bytes, expected {start + self.block_bytes}")
            f.seek(start)
            n = 0
            while n < self.block_bytes and (got := f.readinto(into[n:])):
                n += got
        if n != self.block_bytes:
            raise ValueError(f"payload of {n} bytes, expected {self.block_bytes}")
        if crc32(into) != crc:
            raise ValueError("checksum mismatch")

    def _check_header(self, h: bytes, head: bytes) -> tuple[int, object]:
        """Where the payload starts and the CRC-32 the header gives it, once the header is a
        well-formed one of this block, model and layout."""
        if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
            raise ValueError("not a KV block file")
        (n,) = struct.unpack_from("<I", head, len(MAGIC))
        start = len(MAGIC) + 4 + n
        if n > HEADER_MAX or len(head) < start:
            raise ValueError("truncated header")
        header = json.loads(head[len(MAGIC) + 4 : start])
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        expected = {**self._header, "hash": h.hex(), "bytes": self.block_bytes}
        wrong = sorted(k for k, v in expected.items() if header.get(k) != v)
        if wrong:
            raise ValueError(f"written for another model or layout ({', '.join(wrong)} differ)")
        return start, header.get("crc32")

    def _forget(self, h: bytes) -> None:
        with self._lock:
            self._resident.discard(h)
        self._queue.put(("forget", h))

    # --- writing (queued here, done by the writer thread) --------------------------------------
    def wants(self, h: bytes) -> bool:
        return self.writes_enabled and h not in self._resident and h not in self._pending

    def submit(self, batch: WriteBatch) -> None:
        hashes = batch[0]
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
        finally:
            db.close()

    def _write_batch(self, db: sqlite3.Connection, hashes: list[bytes], payloads, wait) -> None:
        try:
            if wait is not None:
                wait()
            buffers = payloads()
            for h, buf in zip(hashes, buffers):
                if self.writes_enabled:
                    self._write_one(db, h, buf)
        finally:
            with self._lock:
                self._pending.difference_update(hashes)
                self._pending_bytes -= len(hashes) * self.block_bytes
        self._evict(db)

    def _write_one(self, db: sqlite3.Connection, h: bytes, payload: memoryview) -> None:
        header = json.dumps({**self._header, "hash": h.hex(), "bytes": len(payload),
                             "crc32": crc32(payload)}).encode()
        final = self._path(h)
        tmp = final.with_name(f"{final.name}.{os.getpid()}.tmp")
        try:
            with self.opener(tmp, "wb") as f:
                f.write(MAGIC + struct.pack("<I", len(header)) + header)
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            self.counters.write_errors += 1
            self.writes_enabled = False
            log.error("KV disk tier: writing %s failed (%s); disk writes are off, the cache on disk "
                      "stays readable and nothing is lost", final.name, e)
            return
        size = final.stat().st_size
        db.execute("INSERT OR REPLACE INTO blocks VALUES (?, ?, ?, ?)", (self.layout.key(), h, size, time.time()))
        db.commit()
        with self._lock:
            self._resident.add(h)
            self.total_bytes += size
        self.counters.bytes_written += len(payload)

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
            if path is not None:
                path.unlink(missing_ok=True)
            with self._lock:
                if got is not None:
                    self.total_bytes -= got[0]
                if layout == self.layout.key():
                    self._resident.discard(h)
        db.commit()
