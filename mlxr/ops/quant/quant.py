"""Dispatch for GGUF-quantized weights: the C kernels on CPU, Triton on CUDA, torch otherwise.

CPU: the AVX-512 VNNI integer-dot kernel takes every row count: it reads each weight byte
once for decode, and for prefill its int8 dot products beat dequantizing to fp32 and torch's
fp32 GEMM (2x at 128 rows, bench/quant_cpu.py --m 128). The portable-C build is slower than
that GEMM from CPU_GEMM_MIN_ROWS rows, so there many rows take the GEMM. Not bf16: its rounding of
weights and activations (~0.4%) flips 2-3% of top-1 tokens of the TinyLlama shape against the
fp32 reference, where the kernel's 16-bit activations flip none.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from mlxr.ops.backend import use_triton
from mlxr.ops.quant import cpu as quant_cpu
from mlxr.ops.quant import extra as quant_extra
from mlxr.ops.quant import mxfp4
from mlxr.ops.quant.block_types import CPU_INT_TYPES, MXFP4_TYPES

# MLXR_KERNELS=reference (read once): dequantize + fp32 GEMM on the CPU too, a continuous
# function of the activations, which tests compare at 1e-5 (the kernels round activations).
CPU_REFERENCE = os.environ.get("MLXR_KERNELS", "auto") == "reference"

# Rows from which dequantize + fp32 GEMM beats the portable-C integer kernel (bench/quant_cpu.py).
CPU_GEMM_MIN_ROWS = quant_cpu.GEMM_MIN_ROWS[0]


def qmatmul(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int, repacked=None) -> torch.Tensor:
    """x (..., k) @ W^T for the (n, k) weight stored as GGUF blocks in `raw`; result in x.dtype.
    `repacked`: the weight's repack.RepackedWeight where the load built one (CUDA only)."""
    if qtype in MXFP4_TYPES:
        return mxfp4.mxfp4_matmul(x, raw, k)
    if x.is_cpu and not CPU_REFERENCE and qtype in CPU_INT_TYPES:
        return _qmatmul_cpu(x, raw, qtype, k)
    if quant_extra.is_extra(qtype):
        return quant_extra.qmatmul(x, raw, qtype, k)
    if use_triton(x, raw):
        from mlxr.ops.quant.core_triton import qmatmul_triton

        return qmatmul_triton(x, raw, qtype, k, repacked=repacked)
    from mlxr.ops.quant.reference import qmatmul_reference

    return qmatmul_reference(x, raw, qtype, k)


def prepare_repacked(raw: torch.Tensor, qtype: str, k: int):
    """The weight's repacked layout where the measured table picks the repacked GEMM for its type
    and shape on raw's device (gemm_triton.wants_repack), else None."""
    from mlxr.ops.quant.repack import can_repack

    if raw.device.type != "cuda" or not can_repack(qtype, k):
        return None
    from mlxr.ops.quant.gemm_triton import wants_repack

    if not wants_repack(qtype, raw.shape[0], k, raw.device):
        return None
    from mlxr.ops.quant.repack import repack

    return repack(raw, qtype, k)


def dequantize_rows(raw: torch.Tensor, rows: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    """Rows of the weight in float32: an embedding lookup."""
    if qtype in MXFP4_TYPES:
        return mxfp4.dequantize(raw.index_select(0, rows.reshape(-1)), k).reshape(*rows.shape, k)
    if quant_extra.is_extra(qtype):
        return quant_extra.dequantize_rows(raw, rows, qtype, k)
    if raw.device.type == "cpu" and quant_cpu.available():
        return quant_cpu.dequantize_rows_cpu(raw, rows, qtype, k)
    from mlxr.ops.quant.reference import dequantize_rows as reference_rows

    return reference_rows(raw, rows, qtype, k)


def _qmatmul_cpu(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    # Called ~100 times a decode step: the common case (VNNI build) checks one cached flag.
    if quant_cpu.vectorized() or (quant_cpu.available() and x.numel() // k < quant_cpu.gemm_min_rows()):
        if x.dtype == torch.float32:  # .float() and .to() cost ~1 us even when they copy nothing
            return quant_cpu.qmatmul_cpu(x, raw, qtype, k)
        return quant_cpu.qmatmul_cpu(x.float(), raw, qtype, k).to(x.dtype)
    if not quant_cpu.available():
        from mlxr.ops.quant.reference import qmatmul_reference

        return qmatmul_reference(x, raw, qtype, k)
    weight = quant_cpu.dequantize_cpu(raw, qtype, k)
    return F.linear(x.float(), weight).to(x.dtype)
