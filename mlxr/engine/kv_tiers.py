"""The KV cache's lower tiers behind the device's prefix cache, keyed by the same chained block
hashes: a host-memory pool that evicted blocks are copied into (LRU), and a disk store
(kv_disk.py) that every newly committed block is written to in the background.

The block manager calls evicted / committed / prefetch / lookup / load while it schedules; the
copies are queued in order and run by flush() before the step's forward (and after a step
lands), batched (kv_tier_copies.py): a restored prefix is one transfer per run of consecutive
host slots and one index_copy_ per cache tensor. On CUDA they run on side streams into pinned
memory: the side stream waits for the work already queued, and the forward waits for the loads,
so the host never blocks on them. A block's bytes are laid out
[layers, K|V, block_size, kv_heads, head_dim], in host memory as on disk."""
from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass

import torch

from mlxr.engine.kv_cache import KVCache
from mlxr.engine.kv_disk import DiskStore
from mlxr.engine.kv_tier_copies import plan, runs

log = logging.getLogger(__name__)

BOUNCE_BYTES = 128 << 20  # pinned memory for disk payloads on their way to the device (grows if need be)


@dataclass
class HostCounters:
    hits: int = 0
    bytes_read: int = 0  # copied back to the device
    bytes_written: int = 0  # copied in from the device
    copy_calls: int = 0  # host<->device transfers issued for the host tier, both ways


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
        # a load waits for it only where it reads a slot being written (self._saving).
        self.save_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._saving: set[int] = set()
        if self.cuda and disk is not None:  # pinned before the first restore, which is then not slowed
            rows = min(kv.num_blocks, max(1, BOUNCE_BYTES // self.block_bytes))
            self._bounce = torch.empty((rows, *self.block_shape), dtype=self.dtype, pin_memory=True)
            self._bounce_done = torch.cuda.Event()
        # ("save", device block, host slot) | ("load", source, device block) | ("persist", hash, device block)
        self._ops: list[tuple] = []

    # --- the block manager's hooks -------------------------------------------------------------
    def evicted(self, h: bytes, block: int) -> None:
        """A cached block leaves the device: keep a copy in host memory."""
        if self.host is not None and self.host.get(h) is None:
            self._ops.append(("save", block, self.host.assign(h)))

    def committed(self, h: bytes, block: int) -> None:
        """A block was computed and published: write it to disk unless it is there."""
        if self.disk is not None and self.disk.wants(h):
            self._ops.append(("persist", h, block))

    def prefetch(self, hashes: list[bytes]) -> None:
        """A chain of blocks the device misses: start reading those that only the disk has."""
        if self.disk is None:
            return
        from_disk = []
        for h in hashes:
            if self.host is not None and h in self.host.slot_of:
                continue
            if not self.disk.contains(h):
                break  # the chain stops here
            from_disk.append(h)
        self.disk.prefetch(from_disk)

    def lookup(self, h: bytes) -> object | None:
        """Where a block the device misses can come from: a host slot or a verified disk payload."""
        if self.host is not None and (slot := self.host.get(h)) is not None:
            self.host_counters.hits += 1
            self.host_counters.bytes_read += self.block_bytes
            return slot
        if self.disk is not None and (payload := self.disk.read(h)) is not None:
            return torch.frombuffer(payload, dtype=self.dtype).view(self.block_shape)
        return None

    def load(self, source: object, block: int) -> None:
        self._ops.append(("load", source, block))

    # --- the copies ----------------------------------------------------------------------------
    @torch.inference_mode()
    def flush(self) -> None:
        """Run the queued copies, regrouped into a few batched phases (kv_tier_copies.plan)."""
        if not self._ops:
            return
        ops, self._ops = self._ops, []
        if self.stream is None:
            self._run(ops)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            self._run(ops)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)

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
        """The blocks' K and V of every layer, [blocks, layers, K|V, ...], in 2 x layers + 1 kernels."""
        idx = self._index(blocks)
        parts = [t.index_select(0, idx) for k, v in self.layers for t in (k, v)]
        return torch.stack(parts, 1).view(len(blocks), *self.block_shape)

    def _save(self, saves: list[tuple[int, int]]) -> None:
        """Device blocks to host slots (sorted by slot): one transfer per run of consecutive slots."""
        blocks = self._gather([block for block, _ in saves])
        if self.cuda:
            self.save_stream.wait_stream(self.stream)
            blocks.record_stream(self.save_stream)
            self._saving.update(slot for _, slot in saves)
        with torch.cuda.stream(self.save_stream) if self.cuda else contextlib.nullcontext():
            for pos, first, n in runs([slot for _, slot in saves]):
                self.host.data[first : first + n].copy_(blocks[pos : pos + n], non_blocking=True)
                self.host_counters.copy_calls += 1
        self.host_counters.bytes_written += len(saves) * self.block_bytes

    def _load(self, loads: list[tuple[object, int]]) -> None:
        """Host slots (one transfer per run of consecutive slots) and disk payloads (gathered in
        pinned memory, one transfer) into a staging tensor, then one index_copy_ per cache tensor."""
        from_host = sorted((src, block) for src, block in loads if isinstance(src, int))
        from_disk = [(src, block) for src, block in loads if not isinstance(src, int)]
        if self._saving.intersection(slot for slot, _ in from_host):
            self.stream.wait_stream(self.save_stream)
            self._saving.clear()
        staged = torch.empty((len(loads), *self.block_shape), dtype=self.dtype, device=self.device)
        for pos, first, n in runs([slot for slot, _ in from_host]):
            staged[pos : pos + n].copy_(self.host.data[first : first + n], non_blocking=True)
            self.host_counters.copy_calls += 1
        if from_disk:
            rest = staged[len(from_host) :]
            bounce = self._bounce_rows(len(from_disk)) if self.cuda else rest
            for i, (payload, _) in enumerate(from_disk):
                bounce[i].copy_(payload)
            if self.cuda:
                rest.copy_(bounce, non_blocking=True)
                self._bounce_done.record(self.stream)
        idx = self._index([block for _, block in from_host + from_disk])
        for layer, (k, v) in enumerate(self.layers):
            k.index_copy_(0, idx, staged[:, layer, 0])
            v.index_copy_(0, idx, staged[:, layer, 1])

    def _bounce_rows(self, n: int) -> torch.Tensor:
        """Pinned rows that disk payloads cross to the device, kept from flush to flush (pinning
        memory takes long): waits for the last transfer out of them, which has rarely not ended."""
        if self._bounce.shape[0] < n:
            self._bounce = torch.empty((max(n, 2 * self._bounce.shape[0]), *self.block_shape), dtype=self.dtype,
                                       pin_memory=True)
        else:
            self._bounce_done.synchronize()
        return self._bounce[:n]

    def _persist(self, persists: list[tuple[bytes, int]]) -> None:
        blocks = self._gather([block for _, block in persists])
        wait = None
        if self.cuda:
            host = torch.empty(blocks.shape, dtype=self.dtype, pin_memory=True)
            host.copy_(blocks, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
            blocks, wait = host, event.synchronize
        rows = blocks.view(len(persists), -1).view(torch.uint8)
        self.disk.submit(([h for h, _ in persists], lambda: [memoryview(r.numpy()) for r in rows], wait))

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
                           "writes_enabled": int(self.disk.writes_enabled)}
        return out

    def close(self) -> None:
        if self.disk is not None:
            self.flush()
            self.disk.close()
