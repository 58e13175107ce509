"""A rank's share of one weight: rows (outputs) or columns (inputs) of a dense, FP8 or GGUF
linear, and rows of an embedding. GGUF rows are whole blocks, so columns split only on block
boundaries (Q8_0: 32 values, K-quants: 256)."""
from __future__ import annotations

import torch
from torch import nn

from mlxr.layers.fp8_linear import FP8Linear
from mlxr.layers.quant_linear import QuantEmbedding, QuantLinear
from mlxr.ops.quant.block_types import quant_type

Ranges = list[tuple[int, int]]


class ShardingError(ValueError):
    """The model cannot be split over this many ranks (the message says which shape)."""


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)


def _rows(t: torch.Tensor, ranges: Ranges, pad_to: int = 0) -> torch.Tensor:
    out = torch.cat([t[s:e] for s, e in ranges])
    if pad_to > out.shape[0]:
        out = torch.cat([out, out.new_zeros(pad_to - out.shape[0], *out.shape[1:])])
    return out.contiguous()


def take_rows(m: nn.Module, ranges: Ranges, memo: dict, pad_to: int = 0) -> None:
    """Keep the output rows in `ranges` (concatenated; zero rows up to pad_to). memo keeps a
    weight shared by two modules (a tied lm_head) shared after the cut."""
    n = sum(e - s for s, e in ranges)
    if isinstance(m, QuantLinear):
        m.raw = _memo_rows(m.raw, ranges, memo, max(n, pad_to))
    elif isinstance(m, FP8Linear):
        m.weight_fp8 = _rows(m.weight_fp8, ranges, pad_to)
        m.weight_scale = _rows(m.weight_scale.t(), ranges, pad_to).t().contiguous()
    elif isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2:
        key = (id(m.weight), max(n, pad_to))
        memo.setdefault("alive", []).append(m.weight)
        if key not in memo:
            memo[key] = _param(_rows(m.weight.detach(), ranges, pad_to))
        m.weight = memo[key]
    else:
        raise ShardingError(f"no rule to split a {type(m).__name__} by its outputs")
    if getattr(m, "bias", None) is not None:
        m.bias = _param(_rows(m.bias.detach(), ranges, pad_to))
    if hasattr(m, "out_features"):
        m.out_features = max(n, pad_to)


def _memo_rows(raw: torch.Tensor, ranges: Ranges, memo: dict, pad_to: int) -> torch.Tensor:
    key = (raw.data_ptr(), pad_to)
    memo.setdefault("alive", []).append(raw)  # no freed tensor's address is met again
    if key not in memo:
        memo[key] = _rows(raw, ranges, pad_to)
    return memo[key]


def take_columns(m: nn.Module, start: int, end: int, name: str) -> torch.Tensor | None:
    """Keep input columns [start, end); returns the bias, taken off the module (a row-parallel
    layer adds it once, after the sum over ranks)."""
    if isinstance(m, QuantLinear):
        qt = quant_type(m.qtype)
        if start % qt.block_elems or end % qt.block_elems:
            raise ShardingError(f"{name}: {m.qtype} blocks hold {qt.block_elems} inputs; this rank's share "
                                f"[{start}, {end}) of {m.in_features} does not fall on block boundaries "
                                f"(use fewer ranks, or a type with smaller blocks such as Q8_0)")
        b = qt.block_bytes
        m.raw = m.raw[:, start // qt.block_elems * b: end // qt.block_elems * b].contiguous()
    elif isinstance(m, FP8Linear):
        m.weight_fp8 = m.weight_fp8[:, start:end].contiguous()
    elif isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2:
        m.weight = _param(m.weight.detach()[:, start:end])
    else:
        raise ShardingError(f"{name}: no rule to split a {type(m).__name__} by its inputs")
    if hasattr(m, "in_features"):
        m.in_features = end - start
    bias, m.bias = getattr(m, "bias", None), None
    return bias


def take_embedding_rows(m: nn.Module, start: int, end: int, memo: dict) -> None:
    if isinstance(m, QuantEmbedding):
        m.raw = _memo_rows(m.raw, [(start, end)], memo, end - start)
        m.num_embeddings = end - start
    elif isinstance(m, nn.Embedding):
        key = (id(m.weight), end - start)
        memo.setdefault("alive", []).append(m.weight)
        if key not in memo:
            memo[key] = _param(m.weight.detach()[start:end])
        m.weight, m.num_embeddings = memo[key], end - start
    else:
        raise ShardingError(f"no rule to split a {type(m).__name__} embedding")
