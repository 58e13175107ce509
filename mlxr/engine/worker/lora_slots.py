"""The LoRA adapters an engine serves: every loaded adapter's weights on the host, and
`max_loras` resident slots in the model's wrapped projections (layers/lora.py).

A request holds its adapter's slot from the runner's first sight of it to its finish or
preemption; a slot no request holds is idle and is the first reused (least recently used)
when another adapter must come in. Unloading an adapter takes its name away from new requests
at once; requests already admitted keep its weights (by id) until the last of them is gone."""
from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mlxr.errors import AdapterError, ModelNotFoundError
from mlxr.formats.lora_adapter import AdapterFile, LoRABounds
from mlxr.layers.lora import LoRATargets

log = logging.getLogger(__name__)

Prepared = dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]]
ReadAdapter = Callable[[str, str, LoRABounds], AdapterFile]


@dataclass(frozen=True)
class Adapter:
    name: str
    path: str
    lora_id: int  # vLLM's lora_int_id: the KV events carry it
    root: bytes  # the prefix-cache chain's first parent: blocks under it serve this adapter only
    weights: Prepared


def _digest(name: str, weights: Prepared) -> bytes:
    h = hashlib.sha256(b"mlxr-lora\0" + name.encode() + b"\0")
    for w in sorted(weights):
        for part, (a, b) in sorted(weights[w].items()):
            h.update(f"{w}.{part}".encode())
            h.update(a.numpy().tobytes())
            h.update(b.numpy().tobytes())
    return h.digest()


class AdapterSlots:
    def __init__(self, targets: LoRATargets, read: ReadAdapter, bounds: LoRABounds) -> None:
        self.targets, self.read, self.bounds = targets, read, bounds
        self.by_name: dict[str, Adapter] = {}
        self.by_id: dict[int, Adapter] = {}  # loaded and retired ones (unloaded, still held by requests)
        self.slot_of: dict[int, int] = {}  # lora id -> its resident slot
        self.holders = [0] * targets.slots  # running requests per slot
        self.resident: list[int | None] = [None] * targets.slots  # slot -> lora id
        self.idle: OrderedDict[int, None] = OrderedDict((s, None) for s in range(targets.slots))  # LRU first
        self._next_id = 1

    # --- the adapters ---------------------------------------------------------------------------
    def load(self, name: str, path: str) -> Adapter:
        if name in self.by_name:
            raise AdapterError(f"The lora adapter '{name}' has already been loaded.")
        weights = self.targets.prepare(self.read(name, path, self.bounds))
        adapter = Adapter(name, path, self._next_id, _digest(name, weights), weights)
        self._next_id += 1
        self.by_name[name] = self.by_id[adapter.lora_id] = adapter
        log.info("LoRA adapter %r loaded from %s (id %d)", name, path, adapter.lora_id)
        return adapter

    def unload(self, name: str, live_ids: set[int]) -> None:
        adapter = self.by_name.pop(name, None)
        if adapter is None:
            raise ModelNotFoundError(f"The lora adapter '{name}' cannot be found.")
        self.forget_retired(live_ids)
        log.info("LoRA adapter %r unloaded", name)

    def get(self, name: str) -> Adapter:
        adapter = self.by_name.get(name)
        if adapter is None:
            raise ModelNotFoundError(f"The model `{name}` does not exist: no base model or loaded LoRA adapter has that name.")
        return adapter

    def forget_retired(self, live_ids: set[int]) -> None:
        """Drop unloaded adapters that no unfinished request (live_ids) names any more."""
        loaded = {a.lora_id for a in self.by_name.values()}
        for lora_id in [i for i in self.by_id if i not in loaded and i not in live_ids]:
            slot = self.slot_of.get(lora_id)
            if slot is not None and self.holders[slot]:
                continue  # the runner has not yet heard of its last requests' end
            del self.by_id[lora_id]
            if slot is not None:
                del self.slot_of[lora_id]
                self.resident[slot] = None
                self.idle.move_to_end(slot, last=False)  # an empty slot is reused first

    # --- the slots ----------------------------------------------------------------------------
    def acquire(self, lora_id: int) -> int:
        """The slot holding the adapter, loading it into the least recently used idle slot."""
        slot = self.slot_of.get(lora_id)
        if slot is None:
            slot = self._evict()
            self.targets.load(slot, self.by_id[lora_id].weights)
            self.slot_of[lora_id], self.resident[slot] = slot, lora_id
        self.holders[slot] += 1
        self.idle.pop(slot, None)
        return slot

    def release(self, slot: int) -> None:
        self.holders[slot] -= 1
        if self.holders[slot] == 0:
            self.idle[slot] = None  # most recently used last

    def _evict(self) -> int:
        if not self.idle:  # the scheduler admits at most max_loras adapters at once
            raise AdapterError(f"all {self.targets.slots} LoRA slots (--max-loras) serve running requests")
        slot = next(iter(self.idle))
        old = self.resident[slot]
        if old is not None:
            del self.slot_of[old]
        return slot
