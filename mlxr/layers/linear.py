"""Linear layers whose weights are stored in a narrower dtype than the activations.

On CPU, decode is bound by reading weights: fp16 storage halves the bytes while activations
stay fp32. Up to GEMV_MAX_ROWS rows (decode, a speculative row's 1 + k tokens, small batches)
run mlxr/ops/half_linear's kernel, which reads each weight once for all the rows and sums in
fp32 (torch's fp16 product reads them once a row, so a 5-row verify step cost 5 one-row steps);
without that kernel, torch's fp16 product. More rows (prefill, large batches) upcast the weight
and run in the activation dtype."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mlxr.ops.half_linear.half_linear_cpu import fits as half_linear_fits
from mlxr.ops.half_linear.half_linear_cpu import half_linear_cpu
from mlxr.ops.linear.linear import linear


class Linear(nn.Linear):
    """nn.Linear through the dense-linear dispatcher (a Triton GEMV for decode on CUDA)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class VocabProjection(Linear):
    """The lm_head: told apart from other wide matrices (a merged gate/up of a large model has
    as many rows as a vocabulary), which the dispatcher routes differently."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, vocab=True)


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
        cpu = x.device.type == "cpu"
        if cpu and rows > GEMV_MAX_ROWS:
            y = F.linear(x, self.weight.to(x.dtype))
        else:
            y = half_linear_cpu(x, self.weight) if cpu and half_linear_fits(x, self.weight) else None
            if y is None:  # not fp16 weights with fp32 rows, or no AVX-512 build of the kernel
                y = F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)
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
