"""MXFP4 x @ W^T in Triton: each program takes a (BM, BN) tile of the output and walks the 32-weight
blocks of K, decoding a block's E2M1 nibbles and E8M0 scale in registers (mxfp4.py has the
layout: 17 bytes per 32 weights): the weight stays 4-bit in memory. The low and high nibbles of a block are weights
0..15 and 16..31, so each half meets 16 contiguous columns of x in its own dot product."""
from __future__ import annotations

import torch
import triton
import triton.language as tl



@triton.jit
def _e2m1_doubled(code):
    """Codes 0..15 -> 0, 1, 2, 3, 4, 6, 8, 12 and their negatives (bit 3), as float32."""
    mag = code & 7
    val = tl.where(mag < 4, mag, tl.where(mag < 6, 2 * mag - 4, 4 * mag - 16)).to(tl.float32)
    return tl.where((code & 8) != 0, -val, val)


@triton.jit
def _mxfp4_kernel(x_ptr, w_ptr, out_ptr, M, N, KB, stride_xm, stride_om,
                  BM: tl.constexpr, BN: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    j = tl.arange(0, 16)
    m_ok, n_ok = rm < M, rn < N
    row = rn.to(tl.int64) * (KB * 17)  # byte offset of each weight row
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(0, KB):
        e = tl.load(w_ptr + row + kb * 17, mask=n_ok, other=0).to(tl.int32)
        scale = tl.exp2((e - 128).to(tl.float32))  # E8M0, halved for the doubled codes
        q = tl.load(w_ptr + row[None, :] + kb * 17 + 1 + j[:, None], mask=n_ok[None, :], other=0).to(tl.int32)
        w_lo = _e2m1_doubled(q & 15) * scale[None, :]
        w_hi = _e2m1_doubled(q >> 4) * scale[None, :]
        xs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + kb * 32 + j[None, :]
        x_lo = tl.load(xs, mask=m_ok[:, None], other=0.0).to(tl.float32)
        x_hi = tl.load(xs + 16, mask=m_ok[:, None], other=0.0).to(tl.float32)
        acc += tl.dot(x_lo, w_lo, input_precision="ieee")
        acc += tl.dot(x_hi, w_hi, input_precision="ieee")
    outs = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(outs, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def mxfp4_matmul_triton(x: torch.Tensor, raw: torch.Tensor, k: int) -> torch.Tensor:
    """x (..., k) @ W^T for the (n, k // 32 * 17) uint8 MXFP4 weight; the result in x.dtype."""
    n, row_bytes = raw.shape[0], k // 32 * 17
    if k % 32 or raw.shape[1] != row_bytes or raw.dtype != torch.uint8:
        raise ValueError(f"MXFP4 weight of {k} columns must be uint8 (n, {row_bytes}), got {tuple(raw.shape)}")
    x2 = x.reshape(-1, k).contiguous()
    out = torch.empty(x2.shape[0], n, device=x.device, dtype=x.dtype)
    bm = 16 if x2.shape[0] <= 16 else 32
    bn = 32
    grid = (triton.cdiv(x2.shape[0], bm), triton.cdiv(n, bn))
    _mxfp4_kernel[grid](x2, raw.contiguous(), out, x2.shape[0], n, k // 32, x2.stride(0), out.stride(0),
                        BM=bm, BN=bn)
    return out.reshape(*x.shape[:-1], n)
