"""Dense matrix products: one dispatcher for y = x W^T + b with unquantized weights."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mlxr.ops.backend import use_triton

_GEMV_DTYPES = (torch.bfloat16, torch.float16)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton GEMV for a single row of x against 16-bit CUDA weights (decode at batch 1,
    where it beats cuBLAS: bench/probes/gemv.py); torch otherwise."""
    if x.numel() == x.shape[-1] and weight.dtype in _GEMV_DTYPES and x.dtype == weight.dtype \
            and use_triton(x, weight):
        from mlxr.ops.gemv_triton import gemv_triton

        y = gemv_triton(x, weight)
        return y if bias is None else y + bias
    return F.linear(x, weight, bias)
