"""The KV cache's lower tiers behind the device's prefix cache, keyed by the same chained block
hashes: a host-memory pool that evicted blocks are copied into (LRU), and a disk store
(kv/disk.py) that every newly committed block is written to in the background.

The block manager calls evicted / committed / prefetch / lookup / load while it schedules; the
copies are queued in order and run by flush() before the step's forward (and after a step
lands), batched (kv/tier_copies.py): a restored prefix is one transfer per run of consecutive
host slots and one index_copy_ into the cache (every layer's K and V are views of one tensor).
On CUDA they run on side streams into pinned memory: the side stream waits for the work already
queued, and the forward waits for the loads, so the host never blocks on them. Disk blocks are
read (ahead, in parallel) straight into rows of a staging tensor (pinned on CUDA), which cross to
the device in one copy per run of rows. A block's bytes are laid out
[layers, K|V, block_size, kv_heads, head_dim], in host memory as on disk."""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from mlxr.engine.kv.block_file import REASONS, BlockIdentity
from mlxr.engine.kv.cache import KVCache
from mlxr.engine.kv.disk import DiskStore
from mlxr.engine.kv.events import MEDIUM_HOST, KVEventPublisher
from mlxr.engine.kv.staging import StagedRow, StagingRows, one_thread
from mlxr.engine.kv.tier_copies import plan, runs

log = logging.getLogger(__name__)

MAX_SAVE_BATCHES = 32  # save batches whose slots a load may still have to wait for
STAGING_BYTES = 256 << 20  # disk blocks on their way to the device (pinned on CUDA): a 4k-token prefix or more


@dataclass
class HostCounters:
    hits: int = 0
    bytes_read: int = 0  # copied back to the device
    bytes_written: int = 0  # copied in from the device
    copy_calls: int = 0  # host<->device transfers issued for the host tier, both ways


@dataclass
class RestoreTimes:
    """Host time (us) the scheduler's thread spent bringing blocks back, by phase."""

    prefetch_us: int = 0  # starting the disk reads ahead
    lookup_us: int = 0  # disk lookups: reads waited for (or done here)
    flush_us: int = 0  # queuing the copies (all of them: saves, persists and loads)
    preload_us: int = 0  # the start's preload (its reads and copies are counted here only)


class HostPool:
    """Slots of host memory, one block each, least recently used first."""

    def __init__(self, num_slots: int, block_shape: tuple[int, ...], dtype: torch.dtype, pin: bool) -> None:
        self.data = torch.empty((num_slots, *block_shape), dtype=dtype, pin_memory=pin)
        self.slot_of: OrderedDict[bytes, int] = OrderedDict()
        self.free = list(range(num_slots - 1, -1, -1))

    def get(self, h: bytes) -> int | None:
        slot = self.slot_of.get(h)
        if slot is not None:
            self.slot_of.move_to_end(h)
        return slot

    def assign(self, h: bytes) -> int:
        slot = self.free.pop() if self.free else self.slot_of.popitem(last=False)[1]
        self.slot_of[h] = slot
        return slot


class KVTiers:
    def __init__(self, kv: KVCache, host_blocks: int, disk: DiskStore | None) -> None:
        self.layers = kv.layers
        self.all_blocks = kv.blocks  # [layers, K|V, blocks, ...]
        k0 = kv.layers[0][0]
        self.device, self.dtype = k0.device, k0.dtype
        self.block_shape = (len(kv.layers), 2, *k0.shape[1:])
        self.block_bytes = k0[0].numel() * 2 * len(kv.layers) * k0.element_size()
        self.cuda = self.device.type == "cuda"
        self.host = HostPool(host_blocks, self.block_shape, self.dtype, self.cuda) if host_blocks else None
        self.disk = disk
        self.host_counters = HostCounters()
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        # Saves leave the device on a stream of their own, beside the loads (PCIe runs both ways):
        # a load waits only for the save batches that write a slot it reads (self._saving).
        self.save_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._saving: list[tuple[torch.cuda.Event, set[int]]] = []
        self.times = RestoreTimes()
        if disk is not None:  # pinned (or on CPU, written) now: the first restore's page faults were half its reads
            rows = min(kv.num_blocks, max(1, STAGING_BYTES // self.block_bytes))
            self.staging = StagingRows(rows, self.block_shape, self.dtype, self.cuda)
        self._row_of: dict[bytes, int] = {}  # read ahead, not yet looked up
        self.preloaded = 0  # blocks a restart's preload put on the device (kv/preload.py)
        # ("save", device block, host slot) | ("load", source, device block) | ("persist", identity, device block)
        self._ops: list[tuple] = []
        self.events: KVEventPublisher | None = None  # the host tier's blocks are announced as medium CPU

    # --- the block manager's hooks -------------------------------------------------------------
    def evicted(self, h: bytes, block: int) -> None:
        """A cached block leaves the device: keep a copy in host memory."""
        if self.host is not None and self.host.get(h) is None:
            dropped = None if self.host.free else next(iter(self.host.slot_of))
            self._ops.append(("save", block, self.host.assign(h)))
            if self.events is not None:
                if dropped is not None:
                    self.events.removed(dropped, MEDIUM_HOST)
                self.events.copied(h, MEDIUM_HOST)

    def committed(self, h: bytes, block: int, parent: bytes | None, tokens: tuple[int, ...]) -> None:
        """A block was computed and published (hashed as block_hash(parent, tokens)): write it
        to disk unless it is there; its file holds parent and tokens, so a read can check them."""
        if self.disk is not None and self.disk.wants(h):
            self._ops.append(("persist", BlockIdentity(h, parent, tokens), block))

    def prefetch(self, hashes: list[bytes]) -> None:
        """A chain of blocks the device misses: start reading those that only the disk has, each
        into a staging row of its own (rows in use are freed by a flush first if too few are left).
        Without a reader pool (the default) lookups read each block when they reach it."""
        if self.disk is None or not self.disk.reads_ahead:
            return
        t0 = time.perf_counter()
        from_disk = []
        for h in hashes:
            if self.host is not None and h in self.host.slot_of:
                continue
            if not self.disk.contains(h):
                break  # the chain stops here
            from_disk.append(h)
        if self.staging.taken and len(from_disk) - len(self._row_of.keys() & set(from_disk)) > self.staging.free():
            self.flush()
        rows = {h: self._row_of[h] for h in from_disk if h in self._row_of}
        for h in from_disk:
            if h not in rows and self.staging.free():
                rows[h] = self.staging.take()
        self._row_of = rows
        self.disk.prefetch([(h, self.staging.buffer(row)) for h, row in rows.items()])
        self.times.prefetch_us += int(1e6 * (time.perf_counter() - t0))

    def lookup(self, h: bytes) -> object | None:
        """Where a block the device misses can come from: a host slot or a verified disk block
        in a staging row."""
        if self.host is not None and (slot := self.host.get(h)) is not None:
            self.host_counters.hits += 1
            self.host_counters.bytes_read += self.block_bytes
            return slot
        if self.disk is None or not self.disk.contains(h):
            return None
        t0 = time.perf_counter()
        row = self._row_of.pop(h, None)
        if row is None:
            if not self.staging.free():
                self.flush()
            row = self.staging.take()
        found = self.disk.read(h, self.staging.buffer(row)) is not None
        self.times.lookup_us += int(1e6 * (time.perf_counter() - t0))
        return StagedRow(row) if found else None

    def load(self, source: object, block: int) -> None:
        self._ops.append(("load", source, block))

    # --- the copies ----------------------------------------------------------------------------
    @torch.inference_mode()
    def flush(self) -> None:
        """Run the queued copies, regrouped into a few batched phases (kv_tier_copies.plan); the
        disk's read-ahead is over by then (its rows are reused)."""
        if self.disk is not None:
            self.disk.settle()
        if not self._ops:
            self._free_rows()
            return
        t0 = time.perf_counter()
        ops, self._ops = self._ops, []
        if self.stream is None:
            with one_thread():
                self._run(ops)
        else:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                self._run(ops)
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self._free_rows()
        self.times.flush_us += int(1e6 * (time.perf_counter() - t0))

    def _free_rows(self) -> None:
        """After the loads are queued: the staging rows can take new blocks (on CUDA once copied out)."""
        self._row_of.clear()
        if self.disk is not None:
            self.staging.release(self.stream)

    def _run(self, ops: list[tuple]) -> None:
        for phase in plan(ops):
            if phase.saves:
                self._save(sorted(phase.saves, key=lambda op: op[1]))
            if phase.persists:
                self._persist(phase.persists)
            if phase.loads:
                self._load(phase.loads)

    def _index(self, blocks: list[int]) -> torch.Tensor:
        """Block ids on the device without a sync: staged in pinned memory, copied asynchronously."""
        idx = torch.tensor(blocks, dtype=torch.long)
        return idx.pin_memory().to(self.device, non_blocking=True) if self.cuda else idx

    def _gather(self, blocks: list[int]) -> torch.Tensor:
        """The blocks' K and V of every layer, [blocks, layers, K|V, ...], in two kernels."""
        return self.all_blocks.index_select(2, self._index(blocks)).permute(2, 0, 1, 3, 4, 5).contiguous()

    def _save(self, saves: list[tuple[int, int]]) -> None:
        """Device blocks to host slots (sorted by slot): one transfer per run of consecutive slots."""
        if not self.cuda:
            self._save_on_cpu(saves)
            return
        blocks = self._gather([block for block, _ in saves])
        self.save_stream.wait_stream(self.stream)
        blocks.record_stream(self.save_stream)
        with torch.cuda.stream(self.save_stream):
            for pos, first, n in runs([slot for _, slot in saves]):
                self.host.data[first : first + n].copy_(blocks[pos : pos + n], non_blocking=True)
                self.host_counters.copy_calls += 1
        saved = torch.cuda.Event()
        saved.record(self.save_stream)
        self._saving.append((saved, {slot for _, slot in saves}))
        self.host_counters.bytes_written += len(saves) * self.block_bytes

    def _save_on_cpu(self, saves: list[tuple[int, int]]) -> None:
        """Each run of slots gathered straight into the pool, with no tensor in between (a fresh
        one of a prefix's size cost its page faults: 17 ms against 160 ms for 186 MB)."""
        idx = torch.tensor([block for block, _ in saves])
        for pos, first, n in runs([slot for _, slot in saves]):
            rows = self.host.data[first : first + n].permute(1, 2, 0, 3, 4, 5)  # as the cache: [layers, K|V, n, ...]
            torch.index_select(self.all_blocks, 2, idx[pos : pos + n], out=rows)
            self.host_counters.copy_calls += 1
        self.host_counters.bytes_written += len(saves) * self.block_bytes

    def _load(self, loads: list[tuple[object, int]]) -> None:
        """Host slots and staged disk rows into the device cache: one transfer per run of
        consecutive slots or rows, then one index_copy_ into every layer's K and V."""
        from_host = sorted((src, block) for src, block in loads if isinstance(src, int))
        from_disk = sorted((src.index, block) for src, block in loads if isinstance(src, StagedRow))
        if self._saving:
            self._wait_for_saves({slot for slot, _ in from_host})
        host_runs = [(self.host.data, pos, first, n) for pos, first, n in runs([s for s, _ in from_host])]
        disk_runs = [(self.staging.data, len(from_host) + pos, first, n)
                     for pos, first, n in runs([row for row, _ in from_disk])]
        self.host_counters.copy_calls += len(host_runs)
        staged = self._stage(host_runs + disk_runs, len(from_host) + len(from_disk))
        idx = self._index([block for _, block in from_host + from_disk])
        self.all_blocks.index_copy_(2, idx, staged.permute(1, 2, 0, 3, 4, 5))

    def _wait_for_saves(self, slots: set[int]) -> None:
        """Loads wait for the save batches writing a slot they read, not for the others: a
        restore after churn reads the prefix's slots while the churn's blocks leave for others,
        both directions of PCIe at once (waiting for every save serialised them)."""
        if len(self._saving) > MAX_SAVE_BATCHES:  # bounded bookkeeping: wait for all of them once
            self.stream.wait_stream(self.save_stream)
            self._saving.clear()
            return
        pending = []
        for saved, written in self._saving:
            if written & slots:
                self.stream.wait_event(saved)  # later loads on this stream come after it too
            else:
                pending.append((saved, written))
        self._saving = pending

    def _stage(self, pieces: list[tuple[torch.Tensor, int, int, int]], n: int) -> torch.Tensor:
        """The loaded blocks in one tensor on the device, from (source, position, first row, rows)
        runs: on CPU a lone run's rows themselves (no copy)."""
        if not self.cuda and len(pieces) == 1:
            src, _, first, count = pieces[0]
            return src[first : first + count]
        staged = torch.empty((n, *self.block_shape), dtype=self.dtype, device=self.device)
        for src, pos, first, count in pieces:
            staged[pos : pos + count].copy_(src[first : first + count], non_blocking=True)
        return staged

    def _persist(self, persists: list[tuple[BlockIdentity, int]]) -> None:
        blocks = self._gather([block for _, block in persists])
        wait = None
        if self.cuda:
            host = torch.empty(blocks.shape, dtype=self.dtype, pin_memory=True)
            host.copy_(blocks, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
            blocks, wait = host, event.synchronize
        rows = blocks.view(len(persists), -1).view(torch.uint8)
        self.disk.submit(([block for block, _ in persists], lambda: [memoryview(r.numpy()) for r in rows], wait))

    # --- figures -------------------------------------------------------------------------------
    def stats(self) -> dict[str, dict[str, int]]:
        out = {}
        if self.host is not None:
            c = self.host_counters
            out["host"] = {"hits": c.hits, "bytes_read": c.bytes_read, "bytes_written": c.bytes_written,
                           "copy_calls": c.copy_calls, "blocks": len(self.host.slot_of),
                           "capacity_blocks": self.host.data.shape[0]}
        if self.disk is not None:
            c = self.disk.counters
            out["disk"] = {"hits": c.hits, "bytes_read": c.bytes_read, "bytes_written": c.bytes_written,
                           "blocks": self.disk.num_blocks, "skipped_files": c.skipped_files,
                           "write_errors": c.write_errors, "dropped_writes": c.dropped_writes,
                           "writes_enabled": int(self.disk.writes_enabled), "preloaded_blocks": self.preloaded,
                           **{f"rejected_{reason}": c.rejected[reason] for reason in REASONS}}
        if out:
            out["restore"] = vars(self.times).copy()
        return out

    def close(self) -> None:
        if self.disk is not None:
            self.flush()
            self.disk.close()
