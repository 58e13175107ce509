"""Per-op time per engine step, from CUDA events (or wall clock on CPU) around each module.

Attach to a model, run steps eagerly (CUDA graphs hide the ops), read the breakdown."""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn

from mlxr.layers.attention import PagedAttention
from mlxr.layers.fp8_linear import FP8Linear
from mlxr.layers.linear import StoredLinear
from mlxr.layers.mlp import GatedMLP
from mlxr.layers.norm import RMSNorm
from mlxr.layers.quant_linear import QuantLinear
from mlxr.layers.rope import RotaryEmbedding


def op_name(name: str, module: nn.Module) -> str | None:
    """Group modules into the ops a kernel author cares about."""
    if isinstance(module, PagedAttention):
        return "attention (paged)"
    if isinstance(module, RotaryEmbedding):
        return "rotary"
    if isinstance(module, RMSNorm):
        return "rmsnorm"
    # Every kind of linear layer: a quantized GGUF's matmuls are QuantLinear, and leaving them
    # out made the norms look like most of a step.
    if isinstance(module, (nn.Linear, StoredLinear, QuantLinear, FP8Linear)):
        return "lm_head" if name.endswith("lm_head") else ("mlp matmuls" if ".mlp." in name else "attn matmuls")
    if isinstance(module, GatedMLP):
        return None  # its matmuls are counted above; the activation is the remainder
    return None


@dataclass
class OpTime:
    op: str
    calls: int
    total_ms: float


class OpProfiler:
    def __init__(self, model: nn.Module) -> None:
        self.cuda = next(model.parameters()).is_cuda
        self.pending: list[tuple[str, object, object]] = []
        self.totals: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.forwards = 0  # model forward passes timed (a step that only lands its tokens runs none)
        self.handles = [model.register_forward_hook(self._count_forward)]
        for name, module in model.named_modules():
            op = op_name(name, module)
            if op is not None:
                self.handles.append(module.register_forward_pre_hook(self._start(op)))
                self.handles.append(module.register_forward_hook(self._stop(op)))
        self._open: dict[str, list] = defaultdict(list)

    def _count_forward(self, module, args, out) -> None:
        self.forwards += 1

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def _start(self, op: str):
        def hook(module, args):
            self._open[op].append(self._mark())
        return hook

    def _stop(self, op: str):
        def hook(module, args, out):
            self.pending.append((op, self._open[op].pop(), self._mark()))
        return hook

    def collect(self) -> None:
        """Fold the events of the steps run so far into the totals (syncs the device)."""
        if self.cuda:
            torch.cuda.synchronize()
        for op, start, end in self.pending:
            ms = start.elapsed_time(end) if self.cuda else 1000 * (end - start)
            self.totals[op] += ms
            self.calls[op] += 1
        self.pending.clear()

    def reset(self) -> None:
        """Forget what was timed so far (e.g. the prefill, when decode steps are wanted)."""
        self.collect()
        self.totals.clear()
        self.calls.clear()
        self.forwards = 0

    def breakdown(self) -> list[OpTime]:
        self.collect()
        return sorted((OpTime(op, self.calls[op], self.totals[op]) for op in self.totals), key=lambda t: -t.total_ms)

    def close(self) -> None:
        for h in self.handles:
            h.remove()
