"""y = x W^T for 16-bit weights, or FP8 (E4M3) ones with a scale per row, and a few rows of x
(decode), in Triton.

A decode step reads every weight once per token, so its matrix products are bound by
memory: each program streams BN whole rows of W, accumulating x * w elementwise in fp32 and
reducing once at the end (no per-step cross-lane sums)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlxr.ops.pdl_triton import pdl_launch, wait_for_inputs

MAX_ROWS = 4  # rows of x one launch takes (one accumulator tile per row)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, N, K, stride_xm, stride_wn, stride_om,
                 M: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN: tl.constexpr,
                 HAS_SCALE: tl.constexpr, PDL: tl.constexpr):
    wait_for_inputs(PDL)
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    rows_c = tl.minimum(rows, N - 1)  # out-of-range rows re-read the last one, never stored
    s0, s1, s2, s3 = row_dots(x_ptr, w_ptr, rows_c, K, stride_xm, stride_wn, M, BN, BK, EVEN)
    if HAS_SCALE:
        scale = tl.load(scale_ptr + rows_c)
        s0, s1, s2, s3 = s0 * scale, s1 * scale, s2 * scale, s3 * scale
    ok_rows = rows < N
    dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + rows, s0.to(dtype), mask=ok_rows)
    if M > 1:
        tl.store(out_ptr + stride_om + rows, s1.to(dtype), mask=ok_rows)
    if M > 2:
        tl.store(out_ptr + 2 * stride_om + rows, s2.to(dtype), mask=ok_rows)
    if M > 3:
        tl.store(out_ptr + 3 * stride_om + rows, s3.to(dtype), mask=ok_rows)


@triton.jit
def row_dots(x_ptr, w_ptr, rows, K, stride_xm, stride_wn,
             M: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN: tl.constexpr):
    """fp32 dot products of the given BN weight rows with each of M rows of x (the sums of
    rows M..3 are zeros): the whole K loop of a GEMV program."""
    cols = tl.arange(0, BK)
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wn + cols[None, :]
    acc0 = tl.zeros([BN, BK], dtype=tl.float32)
    acc1 = tl.zeros([BN, BK], dtype=tl.float32)
    acc2 = tl.zeros([BN, BK], dtype=tl.float32)
    acc3 = tl.zeros([BN, BK], dtype=tl.float32)
    for k in range(0, K, BK):
        if EVEN:
            w = tl.load(w_ptrs + k).to(tl.float32)
            xk = x_ptr + k + cols
            x0 = tl.load(xk).to(tl.float32)
        else:
            ok = (k + cols) < K
            w = tl.load(w_ptrs + k, mask=ok[None, :], other=0.0).to(tl.float32)
            xk = x_ptr + k + cols
            x0 = tl.load(xk, mask=ok, other=0.0).to(tl.float32)
        acc0 += w * x0[None, :]
        if M > 1:
            acc1 += w * _x_row(xk, stride_xm, 1, k, K, cols, EVEN)[None, :]
        if M > 2:
            acc2 += w * _x_row(xk, stride_xm, 2, k, K, cols, EVEN)[None, :]
        if M > 3:
            acc3 += w * _x_row(xk, stride_xm, 3, k, K, cols, EVEN)[None, :]
    return tl.sum(acc0, axis=1), tl.sum(acc1, axis=1), tl.sum(acc2, axis=1), tl.sum(acc3, axis=1)


@triton.jit
def _x_row(xk, stride_xm, m: tl.constexpr, k, K, cols, EVEN: tl.constexpr):
    if EVEN:
        return tl.load(xk + m * stride_xm).to(tl.float32)
    return tl.load(xk + m * stride_xm, mask=(k + cols) < K, other=0.0).to(tl.float32)


def launch_config(n: int, k: int) -> tuple[int, int, int]:
    """(block_n, block_k, num_warps) for an [n, k] weight, from bench/probes/gemv.py's sweep with
    the weights out of L2 (H200, gemv-20261123T185529Z): long rows want one row a program,
    short ones 1024 columns a step and a few rows."""
    if k >= 4096:
        return 1, 512, 4
    return (2 if n <= 4096 else 4), 1024, 4


def gemv_triton(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None,
                block_n: int | None = None, block_k: int | None = None, num_warps: int | None = None,
                scale: torch.Tensor | None = None) -> torch.Tensor:
    """Launcher: x [..., K] with at most MAX_ROWS rows, weight [N, K] (rows contiguous), 16-bit
    or E4M3 with `scale` (float32, one per row: W = weight * scale); returns [..., N] in x's
    dtype. Launch knobs left out come from launch_config."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    m, n = x2.shape[0], weight.shape[0]
    assert 1 <= m <= MAX_ROWS, f"gemv_triton takes 1..{MAX_ROWS} rows, got {m}"
    assert weight.dim() == 2 and weight.shape[1] == k and weight.stride(1) == 1
    assert x2.stride(1) == 1
    if scale is None:
        assert weight.dtype in (torch.bfloat16, torch.float16)
    else:
        assert weight.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.numel() == n
    out = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    assert out.shape == (m, n) and out.stride(1) == 1
    default = launch_config(n, k)
    block_n, block_k, num_warps = block_n or default[0], block_k or default[1], num_warps or default[2]
    block_k = min(block_k, triton.next_power_of_2(k))
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x2, weight, weight if scale is None else scale, out, n, k, x2.stride(0), weight.stride(0), out.stride(0),
        M=m, BN=block_n, BK=block_k, EVEN=k % block_k == 0, HAS_SCALE=scale is not None, num_warps=num_warps,
        **pdl_launch(x.device),
    )
    return out.reshape(*x.shape[:-1], n)
