"""Dense matrix products: one dispatcher for y = x W^T + b with unquantized weights."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from mlxr.ops.backend import use_triton

_GEMV_DTYPES = (torch.bfloat16, torch.float16)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, vocab: bool = False) -> torch.Tensor:
    """16-bit CUDA weights: the Triton GEMV for a single row of x (decode at batch 1, where it
    beats cuBLAS: bench/probes/gemv.py), the Triton batch kernel where `rows_config` measured it
    ahead on Hopper; torch otherwise. `vocab`: the product is the lm_head's."""
    if weight.dtype in _GEMV_DTYPES and x.dtype == weight.dtype and use_triton(x, weight):
        rows = x.numel() // x.shape[-1]
        if rows == 1:
            from mlxr.ops.linear.gemv_triton import gemv_triton

            y = gemv_triton(x, weight)
            return y if bias is None else y + bias
        cfg = _rows_config(rows, weight, vocab) if x.is_contiguous() else None
        if cfg is not None:
            from mlxr.ops.linear.gemm_rows_triton import gemm_rows_triton

            y = gemm_rows_triton(x, weight, **cfg)
            return y if bias is None else y + bias
    return F.linear(x, weight, bias)


def _rows_config(rows: int, weight: torch.Tensor, vocab: bool) -> dict | None:
    from mlxr.ops.linear.gemm_rows_triton import rows_config

    cfg = rows_config(rows, *weight.shape, vocab=vocab)
    return cfg if cfg is not None and weight.stride(1) == 1 and _hopper(weight.device) else None


@functools.cache
def _hopper(device: torch.device) -> bool:
    """Where the batch kernel was measured (H100/H200); other GPUs keep cuBLAS (Blackwell's
    consumer parts also have too little shared memory a block for its pipelines)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9
