"""LoRA adapters on a model's projections: each wrapped projection keeps its base (dense, fp16
storage or GGUF-quantized) and adds every token's adapter delta on top of the base's output.

attach_lora wraps a llama-family model's q/k/v/o and gate/up/down projections (merged ones too:
a merged q/k/v takes its parts' A matrices stacked and their B matrices block-diagonal, so one
pair of products serves all three). Each wrapper holds `max_loras` slots of A [R, in] and
B [out, R]; the step's LoRAStep says which slot each token reads (set by the model runner, a
step at a time; none set: the base alone, at the base's cost)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from mlxr.errors import AdapterError
from mlxr.formats.lora_adapter import AdapterFile
from mlxr.ops.lora.lora import lora_add

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MERGED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@dataclass
class LoRAStep:
    """The adapters of the step being run: each token's slot (-1: the base alone) and, for the
    torch path, each slot's token rows (None: every row)."""

    token_slots: torch.Tensor | None = None
    groups: list[tuple[int, torch.Tensor | None]] = field(default_factory=list)

    def clear(self) -> None:
        self.token_slots, self.groups = None, []


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, parts: list[int], in_features: int, slots: int, max_rank: int,
                 step: LoRAStep, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.base, self.step, self.parts, self.in_features = base, step, parts, in_features
        width = len(parts) * max_rank
        self.register_buffer("a", torch.zeros(slots, width, in_features, dtype=dtype, device=device), persistent=False)
        self.register_buffer("b", torch.zeros(slots, sum(parts), width, dtype=dtype, device=device), persistent=False)
        self.used = [0] * slots  # each slot's rank columns in use

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        step = self.step
        if step.token_slots is None:
            return y
        y2, x2 = y.view(-1, y.shape[-1]), x.reshape(-1, x.shape[-1])
        lora_add(y2, x2, self.a, self.b, step.token_slots, [(s, rows, self.used[s]) for s, rows in step.groups])
        return y

    def write(self, slot: int, pairs: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """pairs: part index -> (A [r, in], B [part out, r]); the other parts stay zero."""
        self.a[slot].zero_()
        self.b[slot].zero_()
        col, offsets = 0, np.cumsum([0, *self.parts])
        for part, (a, b) in sorted(pairs.items()):
            r = a.shape[0]
            self.a[slot, col:col + r] = a.to(self.a.dtype)
            self.b[slot, offsets[part]:offsets[part + 1], col:col + r] = b.to(self.b.dtype)
            col += r
        self.used[slot] = col


def plain(module: nn.Module | None) -> nn.Module | None:
    """The module a fast path may look through: a wrapper's base while no adapter runs."""
    if isinstance(module, LoRALinear) and module.step.token_slots is None:
        return module.base
    return module


@dataclass
class LoRATargets:
    """Every wrapped projection of a model, by the names adapters use for them."""

    step: LoRAStep
    slots: int
    max_rank: int
    wrappers: list[LoRALinear] = field(default_factory=list)
    names: dict[str, tuple[int, int]] = field(default_factory=dict)  # module name -> (wrapper, part)

    def prepare(self, adapter: AdapterFile) -> dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]]:
        """The adapter's pairs by wrapper and part, each checked against the base's shapes."""
        known = {n.rsplit(".", 1)[-1] for n in self.names}
        for target in adapter.target_modules:
            if target not in known:
                raise AdapterError(f"LoRA adapter {adapter.name!r}: target module {target!r} does not exist in the "
                                   f"base model (it has {', '.join(sorted(known))})")
        out: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        for name, pair in adapter.pairs.items():
            if name not in self.names:
                raise AdapterError(f"LoRA adapter {adapter.name!r}: module {name!r} is not a projection of the base model")
            w, part = self.names[name]
            wrapper = self.wrappers[w]
            want = (wrapper.parts[part], wrapper.in_features)
            if pair.a.shape[1] != want[1] or pair.b.shape[0] != want[0]:
                raise AdapterError(f"LoRA adapter {adapter.name!r}: module {name!r} has A {list(pair.a.shape)} and B "
                                   f"{list(pair.b.shape)}, the base's projection is [{want[0]}, {want[1]}]")
            if pair.rank > self.max_rank:
                raise AdapterError(f"LoRA adapter {adapter.name!r}: module {name!r} has rank {pair.rank}, over "
                                   f"--max-lora-rank {self.max_rank}")
            out.setdefault(w, {})[part] = (torch.from_numpy(pair.a), torch.from_numpy(pair.b))
        return out

    def load(self, slot: int, prepared: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]]) -> None:
        for w, wrapper in enumerate(self.wrappers):
            wrapper.write(slot, prepared.get(w, {}))


def _features(m: nn.Module) -> tuple[int, int] | None:
    """(out, in) of a dense, stored or quantized linear; None for anything else."""
    if isinstance(getattr(m, "out_features", None), int) and isinstance(getattr(m, "in_features", None), int):
        return m.out_features, m.in_features
    weight = getattr(m, "weight", None)
    return tuple(weight.shape) if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


def _part_sizes(owner: nn.Module, attr: str, out: int) -> list[int] | None:
    """A merged projection's parts' rows; None where the owner does not say (not the shared anatomy)."""
    if attr == "qkv_proj":
        if not all(hasattr(owner, a) for a in ("n_heads", "n_kv", "head_dim")):
            return None
        q, kv = owner.n_heads * owner.head_dim, owner.n_kv * owner.head_dim
        return [q, kv, kv] if q + 2 * kv == out else None
    return [out // 2, out // 2]


def attach_lora(model: nn.Module, slots: int, max_rank: int, dtype: torch.dtype,
                device: torch.device) -> LoRATargets:
    """Wrap every projection adapters may target; returns the table the slots are loaded through."""
    targets = LoRATargets(LoRAStep(), slots, max_rank)
    for prefix, owner in list(model.named_modules()):
        for attr, child in list(owner.named_children()):
            if child is None or isinstance(child, LoRALinear) or attr not in (*PROJECTIONS, *MERGED):
                continue
            shape = _features(child)
            parts = None if shape is None else _part_sizes(owner, attr, shape[0]) if attr in MERGED else [shape[0]]
            if parts is None:
                continue  # not a linear of the llama-family anatomy: adapters cannot name it
            inp, names = shape[1], MERGED.get(attr, (attr,))
            wrapper = LoRALinear(child, parts, inp, slots, max_rank, targets.step, dtype, device)
            setattr(owner, attr, wrapper)
            for i, n in enumerate(names):
                targets.names[f"{prefix}.{n}" if prefix else n] = (len(targets.wrappers), i)
            targets.wrappers.append(wrapper)
    if not targets.wrappers:
        raise AdapterError("this model has no projections LoRA adapters can target")
    return targets
