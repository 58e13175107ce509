"""The modules sharding.py puts around a rank's share of a layer: the all-reduce after a
row-parallel linear, and the vocabulary-parallel embedding and lm_head."""
from __future__ import annotations

import torch
from torch import nn

from mlxr.distributed.parallel_state import TPGroup


class RowParallel(nn.Module):
    """A linear over this rank's slice of the input: partial sums, added over ranks, then the
    bias once."""

    def __init__(self, inner: nn.Module, bias: torch.Tensor | None, group: TPGroup) -> None:
        super().__init__()
        self.inner, self.group = inner, group
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.group.all_reduce(self.inner(x))
        return y if self.bias is None else y + self.bias.to(y.dtype)


class VocabParallelEmbedding(nn.Module):
    """Rows [start, end) of the table here; other ids look up zeros and the sum over ranks
    fills every row from the rank that holds it."""

    def __init__(self, inner: nn.Module, start: int, end: int, group: TPGroup) -> None:
        super().__init__()
        self.inner, self.start, self.end, self.group = inner, start, end, group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        here = (ids >= self.start) & (ids < self.end)
        local = torch.where(here, ids - self.start, torch.zeros_like(ids))
        rows = self.inner(local)
        rows = torch.where(here.unsqueeze(-1), rows, torch.zeros_like(rows))
        return self.group.all_reduce(rows)


class VocabParallelLMHead(nn.Module):
    """Logits of this rank's vocabulary rows (padded to an equal share), gathered from every
    rank and cut back to the vocabulary."""

    def __init__(self, inner: nn.Module, vocab_size: int, group: TPGroup) -> None:
        super().__init__()
        self.inner, self.vocab_size, self.group = inner, vocab_size, group

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.group.all_gather_last(self.inner(h))[..., : self.vocab_size]
