"""Linear layers whose weights are stored in a narrower dtype than the activations.

On CPU, decode is bound by reading weights: fp16 storage halves the bytes, and torch's fp16
matrix-vector product is much faster than its fp32 one, while activations stay fp32. Its fp16
matrix-matrix product is slow, though (no fp16 arithmetic on AVX-512 CPUs), so several rows
(prefill, batched decode) upcast the weight and run in the activation dtype."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mlxr.ops.linear import linear


class Linear(nn.Linear):
    """nn.Linear through the dense-linear dispatcher (a Triton GEMV for decode on CUDA)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


# Up to about this many rows fp16 beats upcasting to fp32 on CPU (bench/probes/linear.py).
GEMV_MAX_ROWS = 32


class StoredLinear(nn.Module):
    """y = x W^T + b with W kept in `weight.dtype`; x is cast in and y cast back."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        # Reuse a Parameter as is, so a weight tied to the embedding stays one tensor.
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows <= GEMV_MAX_ROWS or x.device.type != "cpu":
            y = F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)
        else:
            y = F.linear(x, self.weight.to(x.dtype))
        return y if self.bias is None else y + self.bias


def store_weights_as(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Swap every nn.Linear (and the token embedding) to `dtype` storage, keeping ties."""
    cast: dict[int, nn.Parameter] = {}

    def narrow(p: nn.Parameter) -> nn.Parameter:
        if id(p) not in cast:
            cast[id(p)] = nn.Parameter(p.detach().to(dtype), requires_grad=False)
        return cast[id(p)]

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, StoredLinear(narrow(child.weight), child.bias))
            elif isinstance(child, nn.Embedding):
                child.weight = narrow(child.weight)
    return model
