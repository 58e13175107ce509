"""MXFP4 weights kept 4-bit (GGUF type MXFP4, gpt-oss's expert format; OCP Microscaling v1.0):
per 32 weights one E8M0 scale byte, then 16 bytes whose low nibbles are weights 0..15 and high
nibbles weights 16..31, each an E2M1 code (sign bit, then 0, .5, 1, 1.5, 2, 3, 4, 6).

As gguf-py stores it, the codes are doubled (0..12) and the scale halved, 2 ** (e - 128): the
products are the same float32 numbers. A weight is a uint8 tensor (n, k // 32 * 17), rows as the
file stores them; `mxfp4_matmul` runs Triton on CUDA (mxfp4_triton.py) and, elsewhere, torch on
bounded slices of rows, so no more than MXFP4_SLICE_ELEMS weights are ever dequantized at once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mlxr.ops.backend import use_triton

BLOCK_ELEMS, BLOCK_BYTES = 32, 17
# The doubled E2M1 values of codes 0..15 (gguf-py's MXFP4.kvalues).
E2M1_DOUBLED = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
# Weights dequantized at once by the torch path (4 MiB of float32).
MXFP4_SLICE_ELEMS = 1 << 20


def row_bytes(k: int) -> int:
    if k % BLOCK_ELEMS:
        raise ValueError(f"MXFP4 rows need a multiple of {BLOCK_ELEMS} columns, got {k}")
    return k // BLOCK_ELEMS * BLOCK_BYTES


def e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """2 ** (e - 128) as float32, exactly (e = 0 and 1 give subnormals), from uint8 exponents."""
    e = e.to(torch.int32)
    bits = torch.where(e < 2, torch.tensor(0x00200000, dtype=torch.int32, device=e.device) << e, (e - 1) << 23)
    return bits.view(torch.float32)


def dequantize_blocks(blocks: torch.Tensor) -> torch.Tensor:
    """(..., 17) uint8 blocks -> (..., 32) float32."""
    table = torch.tensor(E2M1_DOUBLED, dtype=torch.float32, device=blocks.device)
    qs = blocks[..., 1:].long()
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=-1)
    return e8m0_half(blocks[..., :1]) * table[codes]


def dequantize(raw: torch.Tensor, k: int) -> torch.Tensor:
    """(n, k // 32 * 17) uint8 -> (n, k) float32."""
    if raw.shape[-1] != row_bytes(k):
        raise ValueError(f"MXFP4 rows of {k} columns take {row_bytes(k)} bytes, got {raw.shape[-1]}")
    return dequantize_blocks(raw.reshape(*raw.shape[:-1], k // BLOCK_ELEMS, BLOCK_BYTES)).reshape(*raw.shape[:-1], k)


def mxfp4_matmul(x: torch.Tensor, raw: torch.Tensor, k: int) -> torch.Tensor:
    """x (..., k) @ W^T for the (n, k) MXFP4 weight `raw`; the result in x.dtype."""
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} columns, the weight {k}")
    if use_triton(x, raw):
        from mlxr.ops.quant.mxfp4_triton import mxfp4_matmul_triton

        return mxfp4_matmul_triton(x, raw, k)
    return mxfp4_matmul_torch(x, raw, k)


def mxfp4_matmul_torch(x: torch.Tensor, raw: torch.Tensor, k: int) -> torch.Tensor:
    """The weight dequantized a slice of rows at a time, each slice's product with fp32 GEMM."""
    rows = max(1, MXFP4_SLICE_ELEMS // k)
    xf = x.reshape(-1, k).float()
    parts = [F.linear(xf, dequantize(raw[i:i + rows], k)) for i in range(0, raw.shape[0], rows)]
    return torch.cat(parts, dim=-1).reshape(*x.shape[:-1], raw.shape[0]).to(x.dtype)
