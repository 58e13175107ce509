"""RMSNorm in the two flavours checkpoints use."""
from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Llama flavour: normalise in fp32, cast back, then scale by `weight`."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * self.normalize(x).to(x.dtype)


class GemmaRMSNorm(RMSNorm):
    """Gemma flavour: the stored weight is an offset from 1, applied in fp32 before the cast."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.normalize(x) * (1.0 + self.weight.float())).to(x.dtype)
