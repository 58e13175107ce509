"""Dispatch for the extra GGUF types kept quantized (block_types.EXTRA_TYPES: Q4_1, Q5_1, Q2_K,
Q3_K, IQ4_NL, IQ4_XS): the C kernels of quant_extra.c on CPU, Triton on CUDA
(extra_triton.py), the torch reference otherwise. quant.py sends these types here.

CPU: the kernel reads each weight byte once (decode); from CPU_GEMM_MIN_ROWS rows, dequantizing
once and torch's fp32 GEMM is faster than its per-row fp32 dots (bench/kernels/quant_extra.py --m)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mlxr.ops.backend import use_triton
from mlxr.ops.quant import cpu as quant_cpu
from mlxr.ops.quant.block_types import EXTRA_TYPES

CPU_GEMM_MIN_ROWS = 8


def is_extra(qtype: str) -> bool:
    return qtype in EXTRA_TYPES


def qmatmul(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    """x (..., k) @ W^T for the (n, k) weight stored as GGUF blocks in `raw`; result in x.dtype."""
    if x.is_cpu and quant_cpu.available("quant_extra"):
        if x.numel() // k < CPU_GEMM_MIN_ROWS:
            return quant_cpu.qmatmul_cpu(x.float(), raw, qtype, k).to(x.dtype)
        weight = quant_cpu.dequantize_cpu(raw, qtype, k)
        return F.linear(x.float(), weight).to(x.dtype)
    if not x.is_cpu and use_triton(x, raw):
        from mlxr.ops.quant.extra_triton import qmatmul_extra_triton

        return qmatmul_extra_triton(x, raw, qtype, k)
    from mlxr.ops.quant.reference import qmatmul_reference

    return qmatmul_reference(x, raw, qtype, k)


def dequantize_rows(raw: torch.Tensor, rows: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    """Rows of the weight in float32: an embedding lookup."""
    if raw.is_cpu and quant_cpu.available("quant_extra"):
        return quant_cpu.dequantize_rows_cpu(raw, rows, qtype, k)
    from mlxr.ops.quant.reference import dequantize_rows as reference_rows

    return reference_rows(raw, rows, qtype, k)
