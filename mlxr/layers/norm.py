"""RMSNorm in the two flavours checkpoints use."""
from __future__ import annotations

import torch
from torch import nn

from mlxr.ops.norm.rms_norm import rms_norm, rms_normalize


class RMSNorm(nn.Module):
    """Llama flavour: normalise in fp32, cast back, then scale by `weight`.

    Called with a residual, returns (norm(x + residual), x + residual) from one fused op."""

    gemma = False

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return rms_normalize(x, self.eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return rms_norm(x, self.weight, self.eps, self.gemma, residual)


class GemmaRMSNorm(RMSNorm):
    """Gemma flavour: the stored weight is an offset from 1, applied in fp32 before the cast."""

    gemma = True

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps)
        nn.init.zeros_(self.weight)
