"""Projections of the same input merged into one matrix after loading (q/k/v; gate/up).

One matrix product instead of two or three: fewer kernel launches a layer, and one larger
weight read, which a decode step (bound by reading weights) streams closer to full bandwidth."""
from __future__ import annotations

import torch
from torch import nn

from mlxr.layers.linear import Linear
from mlxr.layers.quant_linear import PackedWeight, QuantLinear


def merge_linears(linears: list[nn.Module]) -> nn.Module | None:
    """One layer whose output is the concatenation of the given ones' outputs, or None when
    they cannot be merged (other layer kinds, mixed dtypes, quant types or biases)."""
    if all(type(m) is QuantLinear for m in linears):
        return _merge_quantized(linears)
    if not all(type(m) in (nn.Linear, Linear) for m in linears):
        return None
    weights = [m.weight for m in linears]
    if len({(w.dtype, w.device, w.shape[1]) for w in weights}) != 1:
        return None
    biases = [m.bias for m in linears]
    if any(b is None for b in biases) != all(b is None for b in biases):
        return None
    merged = Linear(weights[0].shape[1], sum(w.shape[0] for w in weights), bias=biases[0] is not None,
                       device="meta")
    merged.weight = nn.Parameter(torch.cat([w.detach() for w in weights]), requires_grad=False)
    if biases[0] is not None:
        merged.bias = nn.Parameter(torch.cat([b.detach() for b in biases]), requires_grad=False)
    return merged


def _merge_quantized(linears: list[QuantLinear]) -> QuantLinear | None:
    """GGUF rows are independent blocks, so the merged weight is the rows one after another."""
    if len({(m.qtype, m.in_features, m.raw.device) for m in linears}) != 1:
        return None
    biases = [m.bias for m in linears]
    if any(b is None for b in biases) != all(b is None for b in biases):
        return None
    raw = torch.cat([m.raw for m in linears])
    shape = (sum(m.out_features for m in linears), linears[0].in_features)
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    merged = QuantLinear(PackedWeight(raw, linears[0].qtype, shape), bias)
    merged.reset_buffers(raw.device)  # the merged shape's repacked layout, where one pays
    for m in linears:  # the parts' layouts are dropped with them
        m.repacked = None
    return merged


def fuse_projections(model: nn.Module) -> int:
    """Ask every module that can (a `fuse_projections` method) to merge its projections;
    returns how many did."""
    return sum(m.fuse_projections() for m in list(model.modules()) if hasattr(m, "fuse_projections"))
