"""x @ W^T on the tensor cores for a weight in the repacked layout (repack.py), for a handful of
rows up to prefill sizes.

Each program owns BM rows of x by BN output channels and walks K in BK-deep steps (a K-split
across programs where the channels give too few tiles). Per group of G k (32, Q6_K's 16) it
multiplies x's bf16/fp16 slice by the group's integers, which 16-bit floats hold exactly, on the
tensor cores, and folds the group in with its scale, float32, after the product:

    acc += (x_g . q_g) * scale_g  -  sum(x_g) * offset_g

so the weight is never rounded to 16 bits (the integers are exact) and one scale multiply covers
a BM x BN tile. sum(x_g) (per row and group, float32) is computed once per call beside the launch.
With `fold` 0 each group's weights are instead dequantized in registers (q * scale - offset, then
rounded to x's dtype, as dequantize + cuBLAS rounds them) and the products accumulate in the
tensor cores' own float32 accumulator: no BM x BN float32 pass per group. The table
(bench/kernels/quant_gemm_table.py) measures both and keeps the faster.
A split-K launch writes float32 partials that one sum reduces (deterministic, no atomics).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from mlxr.ops.quant.repack import RepackedWeight

# Triton's CPU interpreter (the tests without a GPU) returns garbage from a bf16 x bf16 tl.dot
# (3.9.0; fp16 and fp32 are right): there the products run in float32, which the integers and
# x's 16-bit values make exact as well.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEFAULT = {"bm": 64, "bn": 128, "bk": 128, "split": 1, "warps": 4, "stages": 3, "fold": 1}


@triton.jit
def _dot(xg, qg, DOT_F32: tl.constexpr):
    if DOT_F32:
        return tl.dot(xg.to(tl.float32), qg.to(tl.float32))
    return tl.dot(xg, qg.to(tl.float32).to(xg.dtype))


@triton.jit
def _fold(acc, part, g, s_ptr, m_ptr, xs_ptr, rm, rn, mmask, nmask, N, n_groups, HAS_OFFSET: tl.constexpr):
    s = tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0)
    acc += part * s[None, :]
    if HAS_OFFSET:
        off = tl.load(m_ptr + g * N + rn, mask=nmask, other=0.0)
        xs = tl.load(xs_ptr + rm * n_groups + g, mask=mmask, other=0.0)
        acc -= xs[:, None] * off[None, :]
    return acc


@triton.jit
def _group(acc, xg, qg, g, s_ptr, m_ptr, xs_ptr, rm, rn, mmask, nmask, N, n_groups, HAS_OFFSET: tl.constexpr,
           FOLD: tl.constexpr, DOT_F32: tl.constexpr):
    """acc plus one group's product x_g . W_g (G k deep)."""
    if FOLD:
        return _fold(acc, _dot(xg, qg, DOT_F32), g, s_ptr, m_ptr, xs_ptr, rm, rn, mmask, nmask, N, n_groups,
                     HAS_OFFSET)
    w = qg.to(tl.float32) * tl.load(s_ptr + g * N + rn, mask=nmask, other=0.0)[None, :]
    if HAS_OFFSET:
        w -= tl.load(m_ptr + g * N + rn, mask=nmask, other=0.0)[None, :]
    if DOT_F32:
        return tl.dot(xg.to(tl.float32), w, acc)
    return tl.dot(xg, w.to(xg.dtype), acc)


@triton.jit
def _repacked_kernel(x_ptr, q_ptr, s_ptr, m_ptr, xs_ptr, out_ptr, M, N, K, stride_xm, iters_per_split,
                     BITS: tl.constexpr, G: tl.constexpr, HAS_OFFSET: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr, BK: tl.constexpr, FOLD: tl.constexpr, DOT_F32: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    mmask = rm < M
    nmask = rn < N
    n_groups = K // G
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    first = pid_k * iters_per_split
    last = tl.minimum(first + iters_per_split, K // BK)
    for it in range(first, last):
        kb = it * BK
        if BITS == 4:
            for c in tl.static_range(BK // 64):
                k0 = kb + c * 64
                rows = k0 // 2 + tl.arange(0, 32)
                b = tl.load(q_ptr + rows[:, None] * N + rn[None, :], mask=nmask[None, :], other=0)
                for h in tl.static_range(2):
                    kk = k0 + h * 32 + tl.arange(0, 32)
                    xg = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=mmask[:, None], other=0.0)
                    if h == 0:
                        qg = b & 15
                    else:
                        qg = b >> 4
                    acc = _group(acc, xg, qg, (k0 + h * 32) // 32, s_ptr, m_ptr, xs_ptr, rm, rn, mmask, nmask,
                                 N, n_groups, HAS_OFFSET, FOLD, DOT_F32)
        else:
            for j in tl.static_range(BK // G):
                kk = kb + j * G + tl.arange(0, G)
                qg = tl.load(q_ptr + kk[:, None] * N + rn[None, :], mask=nmask[None, :], other=0)
                xg = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=mmask[:, None], other=0.0)
                acc = _group(acc, xg, qg, (kb + j * G) // G, s_ptr, m_ptr, xs_ptr, rm, rn, mmask, nmask, N,
                             n_groups, HAS_OFFSET, FOLD, DOT_F32)
    omask = mmask[:, None] & nmask[None, :]
    optrs = out_ptr + pid_k * M * N + rm[:, None] * N + rn[None, :]
    tl.store(optrs, acc.to(out_ptr.dtype.element_ty), mask=omask)


def repacked_matmul(x: torch.Tensor, w: RepackedWeight, config: dict | None = None, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) in bf16/fp16 @ W^T -> (..., N) in x.dtype. `config`: bm, bn, bk (a multiple of 64
    dividing K, else 64), split (K-split programs), warps, stages, fold (1: integer products folded
    with their scales in float32; 0: weights dequantized in registers); DEFAULT where absent."""
    cfg = {**DEFAULT, **(config or {})}
    k, n = w.k, w.n
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    bk = cfg["bk"] if k % cfg["bk"] == 0 else 64
    iters = k // bk
    split = max(1, min(int(cfg["split"]), iters))
    per_split = triton.cdiv(iters, split)
    split = triton.cdiv(iters, per_split)
    has_offset = w.offsets is not None
    fold = bool(cfg["fold"])
    xs = x2.float().reshape(m, k // w.group, w.group).sum(-1) if has_offset and fold else w.scales
    if split == 1:
        dest = out.view(m, n) if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    else:
        dest = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, cfg["bn"]), triton.cdiv(m, cfg["bm"]), split)
    _repacked_kernel[grid](x2, w.q, w.scales, w.offsets if has_offset else w.scales, xs, dest, m, n, k,
                           x2.stride(0), per_split, BITS=w.bits, G=w.group, HAS_OFFSET=has_offset,
                           BM=cfg["bm"], BN=cfg["bn"], BK=bk, FOLD=fold, DOT_F32=INTERPRETED, num_warps=cfg["warps"], num_stages=cfg["stages"])
    if split > 1:
        result = dest.sum(0).to(x.dtype)
        if out is not None:
            out.view(m, n).copy_(result)
            dest = out.view(m, n)
        else:
            dest = result
    return dest.reshape(*x.shape[:-1], n)
