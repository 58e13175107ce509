"""y = x W^T for 16-bit weights and a decode batch of rows (tens to a few hundred), in Triton.

A batched decode step still reads every weight once per step, and at these row counts the
products are bound by that read. cuBLAS's kernels for these shapes stream the weights at about
half of an H200's bandwidth when the matrix is small (a few microseconds a call, mostly ramp-up);
this kernel gives each program a narrow band of weight rows and all the batch's rows, so every
weight byte is read once, the grid covers the multiprocessors, and it chains to its neighbours
with programmatic dependent launch. Where it wins is measured, not assumed: `rows_config`."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlxr.ops.pdl_triton import pdl_launch, wait_for_inputs

# Batches this kernel takes: one row tile of 64 (fewer rows than 33 and cuBLAS's kernels were
# not compared; more would read each weight band twice).
MIN_ROWS, MAX_ROWS = 33, 64
SMALL_MATRIX = 8 << 20  # weights of at most this many elements: cuBLAS is ramp-up bound there


def rows_config(m: int, n: int, k: int, vocab: bool = False) -> dict | None:
    """Launch knobs for an [m, k] x [n, k]^T product (`vocab`: the lm_head's), or None where
    cuBLAS stays. From
    bench/probes/gemm_rows_sweep.py on an H200 at 64 rows, the TinyLlama shape (us a call, cuBLAS
    -> this): q/k/v 6.2 -> 6.1, o 6.2 -> 5.4, lm_head 37.7 -> 34.9; gate/up 14.5 -> 14.9 and down
    10.5 -> 11.1 (large matrices: cuBLAS stays). In the decode step, with its neighbours chained,
    batch-64 decode went 46.8-46.9k -> 48.1-48.4k tok/s (.probe A/B, 2026-11-28)."""
    if not MIN_ROWS <= m <= MAX_ROWS:
        return None
    if vocab:
        return dict(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=3)
    if n * k > SMALL_MATRIX:
        return None
    if n <= 2048:
        return dict(block_m=64, block_n=16, block_k=256, num_warps=4, num_stages=4)
    return dict(block_m=64, block_n=32, block_k=128, num_warps=4, num_stages=6)


@triton.jit
def _gemm_rows_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
                      PDL: tl.constexpr):
    wait_for_inputs(PDL)
    # Row tiles vary fastest, so the programs that share a band of weights run side by side
    # and the band is read from memory once (the others hit L2).
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    x_ptrs = x_ptr + tl.minimum(rm, M - 1)[:, None] * stride_xm + rk[None, :]
    w_ptrs = w_ptr + tl.minimum(rn, N - 1)[:, None].to(tl.int64) * stride_wn + rk[None, :]
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(0, K, BK):
        if EVEN_K:
            x = tl.load(x_ptrs)
            w = tl.load(w_ptrs)
        else:
            ok = (k + rk) < K
            x = tl.load(x_ptrs, mask=ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BK
        w_ptrs += BK
    out = acc.to(out_ptr.dtype.element_ty)
    ok_out = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], out, mask=ok_out)


def gemm_rows_triton(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None, *,
                     block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int) -> torch.Tensor:
    """Launcher: x [..., K], weight [N, K] (rows contiguous), both bf16 or both fp16; returns
    [..., N] in x's dtype. Every launch knob is explicit (configs come from the caller's table)."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    m, n = x2.shape[0], weight.shape[0]
    assert weight.dim() == 2 and weight.shape[1] == k and weight.stride(1) == 1 and x2.stride(1) == 1
    assert x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    assert out.shape == (m, n) and out.stride(1) == 1
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _gemm_rows_kernel[grid](
        x2, weight, out, m, n, k, x2.stride(0), weight.stride(0), out.stride(0),
        BM=block_m, BN=block_n, BK=block_k, EVEN_K=k % block_k == 0,
        num_warps=num_warps, num_stages=num_stages, **pdl_launch(x.device),
    )
    return out.reshape(*x.shape[:-1], n)
