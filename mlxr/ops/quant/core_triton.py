"""Triton kernels for GGUF-quantized weights kept in their raw block layout.

A weight is a uint8 tensor (N, K // block_elems * block_bytes): row n is output channel n's
GGUF blocks as the file stores them (mlxr/ops/quant/block_types.py). Nothing is repacked.

How a tile is read from its blocks, and the split-K tail: blocks_triton.py.

Kernels and the paths of `qmatmul_triton` (x has M rows):
- `dequantize_triton`: writes the dense (N, K) matrix. In float32 it is bit-exact to gguf-py
  (and to mlxr/ops/quant/reference.py): all products of the dequantization are exact in float32,
  so whether the compiler contracts `(d*sc)*q - dmin*m` into an FMA does not change the result
  (the FMA's single rounding equals the subtraction's). bfloat16/float16 outputs are that float32
  value rounded to nearest (the GPU's conversion; the CPU interpreter truncates instead).
- M <= FMA_MAX_M where the weight's rows are whole 32-bit words and its base 16-byte aligned
  (`wgemv_fits`; `qgemv_triton`'s default there): the word-stream kernel `_wgemv_kernel` (in
  wgemv_triton.py): one warp per few output channels, each weight word turned into floats with one
  PRMT per weight (inline PTX on the GPU; under the interpreter plain integer ops giving the same
  bits, and tests run the PTX branches there with the two instructions emulated). Its GPU speed is
  not measured yet (bench/kernels/quant_kernels.py --sweep times it beside the kernel below).
- Otherwise M <= _FMA_ROWS[type] (2 or 4; `qgemv_triton`, CUDA cores): each program owns BN output
  channels, streams their bytes once (the next step's loads issued before this step decodes),
  dequantizes in registers and accumulates each row of x with float32 FMAs into a [BN, units, 16]
  register tile, reduced once at the end.
- Up to 16 rows (`qgemv_triton`): the same walk, but the dequantized tile (cast to x's dtype;
  float32 stays float32 with an IEEE dot) multiplies x on the tensor cores (tl.dot, x padded to
  16 rows), float32 accumulation.
- Speed (H200, bench/results/quant_kernels_nvidia_h200.json): short of the 50%-of-HBM goal.
  At one row, large shapes: 0.9-1.0 TB/s of weight bytes for Q4_0/Q6_K, 1.55 TB/s for Q8_0,
  0.3-0.5 TB/s for Q4_K/Q5_K (at or below torch.matmul on the bf16 weight in time). Nsight
  Compute on Q4_K 32000x2048: DRAM 9%, L1TEX 96% busy (94% hits), 65% of stalls on L1TEX
  results: the many small gathered loads (scale bytes and d per row and unit, the activations
  re-read by every row of threads) saturate L1, and the unpacking costs ~8-14 SASS instructions
  per weight. Next steps: one 16-byte header load per super-block shared by its units, the
  activations staged once per program, fewer unpack instructions (packed half2 tricks).
- M > 16 (`qmatmul_triton`, 16-bit x): gemm_triton.py picks, from a table measured on the
  device (gemm_table.json, bench/kernels/quant_gemm_table.py), the fused tensor-core GEMM
  (`_qdot_kernel` with split-K: each weight byte read once per BM rows, dequantized in registers)
  or `dequantize_triton` into a bf16 buffer and torch.matmul (cuBLAS). The latter moves ~8x the
  GGUF weight's bytes a call, so the fused kernel wins at decode batch sizes; cuBLAS wins once the
  product is compute-bound (an earlier sweep at 128..2048 rows with one large fused tile, e.g.
  Q4_K 5632x2048 at 512 rows: 175 us fused vs 38 us). float32 x: always the latter.
- Split-K: see blocks_triton.py (`_finish`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlxr.ops.backend import interpreting, ticket_counters
from mlxr.ops.pdl_triton import pdl_launch, wait_for_inputs
from mlxr.ops.quant.block_types import QUANT_TYPES, quant_type
from mlxr.ops.quant.blocks_triton import FMA_MAX_M, _CODES, _cols, _deq, _finish, _pieces, _raw, _split
from mlxr.ops.quant.gemm_triton import choose, choose_repacked
from mlxr.ops.quant.repack import RepackedWeight
from mlxr.ops.quant.repacked_triton import repacked_matmul

_X_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Rows from which qmatmul_triton leaves the GEMVs for gemm_triton's measured choice.
GEMM_DEQUANT_MIN_M = 17


# --------------------------------------------------------------------------------------------
# Kernels


@triton.jit
def _dequant_kernel(w_ptr, h_ptr, out_ptr, N, stride_w, stride_o,
                    QT: tl.constexpr, BN: tl.constexpr, U: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    rb = (tl.minimum(rows, N - 1).to(tl.int64) * stride_w)[:, None, None]
    unit = (tl.program_id(1) * U + tl.arange(0, U))[None, :, None]
    j = tl.arange(0, 16)[None, None, :]
    lo, hi = _pieces(w_ptr, h_ptr, rb, unit, j, QT)
    c_lo, c_hi = _cols(unit, j, QT)
    ob = out_ptr + (rows.to(tl.int64) * stride_o)[:, None, None]
    ok = (rows < N)[:, None, None]
    tl.store(ob + c_lo, lo.to(out_ptr.dtype.element_ty), mask=ok)
    tl.store(ob + c_hi, hi.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _qgemv_kernel(x_ptr, w_ptr, h_ptr, out_ptr, part_ptr, cnt_ptr, M, N, n_iters, iters_per_split, n_split,
                  stride_xm, stride_w, stride_om,
                  QT: tl.constexpr, BN: tl.constexpr, U: tl.constexpr, MP: tl.constexpr, MPAD: tl.constexpr,
                  SPLIT: tl.constexpr, PDL: tl.constexpr):
    """out[m, n] = sum_k x[m, k] w[n, k] for m < M == MP <= 4 (MPAD: MP padded to a power of two),
    on CUDA cores (float32 FMAs).

    One [BN, U, 16] accumulator per row of x, each in the weight tile's register layout (x's
    [1, U, 16] loads are small enough for the compiler to load them in that layout too, so
    nothing goes through shared memory in the loop); reduced once after it.
    """
    wait_for_inputs(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BN + tl.arange(0, BN)
    rb = (tl.minimum(rows, N - 1).to(tl.int64) * stride_w)[:, None, None]
    ui = tl.arange(0, U)[None, :, None]
    j = tl.arange(0, 16)[None, None, :]
    acc0 = tl.zeros([BN, U, 16], dtype=tl.float32)
    acc1 = tl.zeros([BN, U, 16], dtype=tl.float32)
    acc2 = tl.zeros([BN, U, 16], dtype=tl.float32)
    acc3 = tl.zeros([BN, U, 16], dtype=tl.float32)
    it0 = pid_k * iters_per_split
    it1 = tl.minimum(it0 + iters_per_split, n_iters)
    # Registers double-buffered: the next step's loads are issued before this step decodes.
    r0, r1, r2, r3, r4, r5, r6, r7, r8, r9 = _raw(w_ptr, h_ptr, rb, it0 * U + ui, j, QT)
    for it in range(it0, it1):
        unit = it * U + ui
        nxt = tl.minimum(it + 1, it1 - 1) * U + ui
        n0, n1, n2, n3, n4, n5, n6, n7, n8, n9 = _raw(w_ptr, h_ptr, rb, nxt, j, QT)
        lo, hi = _deq(r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, unit, j, QT)
        c_lo, c_hi = _cols(unit, j, QT)
        acc0 += lo * tl.load(x_ptr + c_lo).to(tl.float32)
        acc0 += hi * tl.load(x_ptr + c_hi).to(tl.float32)
        if MP > 1:
            x1 = x_ptr + tl.minimum(1, M - 1) * stride_xm  # rows >= M are never stored
            acc1 += lo * tl.load(x1 + c_lo).to(tl.float32)
            acc1 += hi * tl.load(x1 + c_hi).to(tl.float32)
        if MP > 2:
            x2 = x_ptr + tl.minimum(2, M - 1) * stride_xm  # rows >= M are never stored
            acc2 += lo * tl.load(x2 + c_lo).to(tl.float32)
            acc2 += hi * tl.load(x2 + c_hi).to(tl.float32)
        if MP > 3:
            x3 = x_ptr + tl.minimum(3, M - 1) * stride_xm  # rows >= M are never stored
            acc3 += lo * tl.load(x3 + c_lo).to(tl.float32)
            acc3 += hi * tl.load(x3 + c_hi).to(tl.float32)
        r0, r1, r2, r3, r4, r5, r6, r7, r8, r9 = n0, n1, n2, n3, n4, n5, n6, n7, n8, n9
    m2 = tl.arange(0, MPAD)[:, None]
    res = tl.where(m2 == 0, tl.sum(tl.sum(acc0, axis=2), axis=1)[None, :], 0.0)  # [MP, BN]
    if MP > 1:
        res += tl.where(m2 == 1, tl.sum(tl.sum(acc1, axis=2), axis=1)[None, :], 0.0)
    if MP > 2:
        res += tl.where(m2 == 2, tl.sum(tl.sum(acc2, axis=2), axis=1)[None, :], 0.0)
    if MP > 3:
        res += tl.where(m2 == 3, tl.sum(tl.sum(acc3, axis=2), axis=1)[None, :], 0.0)
    n2 = rows[None, :]
    out_ptrs = out_ptr + m2 * stride_om + n2
    _finish(res, out_ptrs, (m2 < M) & (n2 < N), part_ptr, cnt_ptr, pid_n, tl.num_programs(0), pid_k, n_split,
            MPAD, BN, SPLIT)


@triton.jit
def _qdot_kernel(x_ptr, w_ptr, h_ptr, out_ptr, part_ptr, cnt_ptr, M, N, n_iters, iters_per_split, n_split,
                 stride_xm, stride_w, stride_om,
                 QT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, U: tl.constexpr, SPLIT: tl.constexpr,
                 IEEE: tl.constexpr):
    """out^T tile [BN, BM] = W tile (dequantized in registers) @ x^T tile, on the tensor cores."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_n * BN + tl.arange(0, BN)
    rb = (tl.minimum(rows, N - 1).to(tl.int64) * stride_w)[:, None, None]
    ui = tl.arange(0, U)[None, :, None]
    j = tl.arange(0, 16)[None, None, :]
    c = tl.arange(0, U * 16)
    ms = pid_m * BM + tl.arange(0, BM)
    xcol = x_ptr + ms[None, :].to(tl.int64) * stride_xm  # [1, BM]
    xok = ms[None, :] < M
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    it0 = pid_k * iters_per_split
    it1 = tl.minimum(it0 + iters_per_split, n_iters)
    r0, r1, r2, r3, r4, r5, r6, r7, r8, r9 = _raw(w_ptr, h_ptr, rb, it0 * U + ui, j, QT)
    for it in range(it0, it1):
        nxt = tl.minimum(it + 1, it1 - 1) * U + ui
        n0, n1, n2, n3, n4, n5, n6, n7, n8, n9 = _raw(w_ptr, h_ptr, rb, nxt, j, QT)
        lo, hi = _deq(r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, it * U + ui, j, QT)
        r0, r1, r2, r3, r4, r5, r6, r7, r8, r9 = n0, n1, n2, n3, n4, n5, n6, n7, n8, n9
        c_lo, c_hi = _cols(it * U + (c >> 4), c & 15, QT)
        xt_lo = tl.load(xcol + c_lo[:, None], mask=xok, other=0.0)  # [U*16, BM]
        xt_hi = tl.load(xcol + c_hi[:, None], mask=xok, other=0.0)
        a_lo = tl.reshape(lo, (BN, U * 16))
        a_hi = tl.reshape(hi, (BN, U * 16))
        if IEEE:  # float32 x; or bf16 under the interpreter, whose bf16 dot is wrong
            a_lo = a_lo.to(x_ptr.dtype.element_ty).to(tl.float32)
            a_hi = a_hi.to(x_ptr.dtype.element_ty).to(tl.float32)
            acc = tl.dot(a_lo, xt_lo.to(tl.float32), acc, input_precision="ieee")
            acc = tl.dot(a_hi, xt_hi.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a_lo.to(x_ptr.dtype.element_ty), xt_lo, acc)
            acc = tl.dot(a_hi.to(x_ptr.dtype.element_ty), xt_hi, acc)
    n2 = rows[:, None]
    m2 = ms[None, :]
    out_ptrs = out_ptr + m2.to(tl.int64) * stride_om + n2
    tile = pid_m * tl.num_programs(1) + pid_n
    n_tiles = tl.num_programs(0) * tl.num_programs(1)
    _finish(acc, out_ptrs, (m2 < M) & (n2 < N), part_ptr, cnt_ptr, tile, n_tiles, pid_k, n_split, BN, BM, SPLIT)


# --------------------------------------------------------------------------------------------
# Launch configuration

# Launch tables, chosen by bench/kernels/quant_kernels.py --sweep on an H200. Per type:
# _GEMV: the CUDA-core kernel's (BN output channels, U units per step, num_warps). Keeping x's
#   [1, U, 16] loads (U*16) and, for the 2-byte aligned types, the scales' [BN, U, 1] loads
#   (BN*U) under the thread count keeps the compiler from moving the weight tile through shared
#   memory every step; the sweep's winners are what was fastest either way.
# _GEMV16: the 16-row tensor-core kernel's (BN, U, num_warps).
# _GEMM: the fused GEMM's (BM, BN, U, num_warps, num_stages).
# _PROGRAMS_PER_SM: the programs split-K aims at, per multiprocessor.
_GEMV = {"Q4_0": (64, 4, 4), "Q5_0": (16, 4, 4), "Q8_0": (32, 4, 8),
         "Q4_K": (32, 4, 4), "Q5_K": (64, 4, 4), "Q6_K": (16, 4, 4)}
_GEMV16 = {name: (128, 4, 8) for name in QUANT_TYPES}
_GEMM = {name: (128, 128, 2, 8, 3) for name in QUANT_TYPES}
_PROGRAMS_PER_SM = {"Q4_0": 4, "Q5_0": 8, "Q8_0": 4, "Q4_K": 4, "Q5_K": 4, "Q6_K": 8}
# Rows up to which each type's GEMV stays on CUDA cores (at most FMA_MAX_M): measured at 2..4 rows.
_FMA_ROWS = {"Q4_0": 2, "Q5_0": 2, "Q8_0": 2, "Q4_K": 4, "Q5_K": 4, "Q6_K": 2}
_DEQUANT = (32, 4, 8)  # dequantize_triton's (BN, U, num_warps)

def _units_per_step(n_units: int, want: int) -> int:
    """The largest power of two <= want dividing the row's units: no tail to mask."""
    u = want
    while n_units % u:
        u //= 2
    return u


def _check(raw: torch.Tensor, qtype: str, k: int) -> int:
    t = quant_type(qtype)
    assert raw.dtype == torch.uint8 and raw.dim() == 2 and raw.is_contiguous(), (raw.dtype, tuple(raw.shape))
    assert raw.shape[1] == t.row_bytes(k), (tuple(raw.shape), qtype, k)
    return _CODES[qtype]


def _check_x(x: torch.Tensor, raw: torch.Tensor, k: int) -> torch.Tensor:
    assert x.shape[-1] == k, (tuple(x.shape), k)
    assert x.dtype in _X_DTYPES, x.dtype
    assert x.device == raw.device, (x.device, raw.device)
    x2 = x.reshape(-1, k)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _ieee(x: torch.Tensor) -> bool:
    """The dot in float32 (IEEE): for float32 x, and for bf16 under the interpreter (its bf16 dot
    multiplies the raw bits; the weight is still rounded to bf16 first)."""
    return x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and interpreting())


def _out(out: torch.Tensor | None, x: torch.Tensor, m: int, n: int) -> torch.Tensor:
    if out is None:
        return torch.empty(m, n, dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.dtype == x.dtype and out.is_contiguous(), (tuple(out.shape), out.dtype)
    assert out.device == x.device
    return out


def dequantize_triton(raw: torch.Tensor, qtype: str, k: int, out_dtype: torch.dtype = torch.bfloat16,
                      out: torch.Tensor | None = None, *, config: dict | None = None) -> torch.Tensor:
    """(N, row_bytes) uint8 GGUF blocks -> the (N, k) weight in out_dtype (float32: exact to gguf-py).
    `config` (benchmarks): bn, u, warps."""
    qt = _check(raw, qtype, k)
    n = raw.shape[0]
    out = torch.empty(n, k, dtype=out_dtype, device=raw.device) if out is None else out
    assert out.shape == (n, k) and out.stride(1) == 1 and out.dtype == out_dtype, (tuple(out.shape), out.dtype)
    assert out_dtype in _X_DTYPES
    if n == 0:
        return out
    cfg = config or {}
    bn, u, warps = cfg.get("bn", _DEQUANT[0]), cfg.get("u", _DEQUANT[1]), cfg.get("warps", _DEQUANT[2])
    n_units = k // 32
    u = _units_per_step(n_units, u)
    grid = (triton.cdiv(n, bn), n_units // u)
    _dequant_kernel[grid](raw, raw.view(torch.int16), out, n, raw.stride(0), out.stride(0),
                          QT=qt, BN=bn, U=u, num_warps=warps)
    return out


def qgemv_triton(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int, *, out: torch.Tensor | None = None,
                 config: dict | None = None) -> torch.Tensor:
    """x (..., k) with at most 16 rows @ W^T -> (..., N) in x.dtype; W streamed once, float32 sums.

    Up to FMA_MAX_M rows where `wgemv_fits`: the word-stream kernel (wgemv_triton.py); else up to _FMA_ROWS[qtype]
    rows: CUDA-core FMAs in float32; more: tensor cores on the dequantized tile in x's dtype (IEEE
    float32 dot for float32 x). `config` (benchmarks, tests) overrides the launch: kind ('ws',
    'fma' or 'dot'; 'ws' where the weight does not allow it: the default kernel), bn (ws: output
    channels per program), u, warps, split, per_sm, asm (ws: the inline-PTX branches).
    """
    qt = _check(raw, qtype, k)
    x2 = _check_x(x, raw, k)
    m, n = x2.shape[0], raw.shape[0]
    assert 1 <= m <= 16, f"qgemv_triton takes 1..16 rows, got {m}"
    out = _out(out, x, m, n)
    cfg = dict(config or {})
    kind = cfg.get("kind", "ws")
    if kind == "ws":
        from mlxr.ops.quant.wgemv_triton import wgemv_fits, wgemv_triton

        if wgemv_fits(raw, qtype, m):
            return wgemv_triton(x2, raw, qtype, k, out, cfg).reshape(*x.shape[:-1], n)
    if kind == "ws":
        kind = "fma" if m <= _FMA_ROWS[qtype] else "dot"
    assert kind == "dot" or m <= FMA_MAX_M, (kind, m)
    bn, u, warps = _GEMV[qtype] if kind == "fma" else _GEMV16[qtype]
    bn, u, warps = cfg.get("bn", bn), cfg.get("u", u), cfg.get("warps", warps)
    mp = triton.next_power_of_2(m) if kind == "fma" else 16  # rows of the result tile
    n_units = k // 32
    u = _units_per_step(n_units, u)
    n_iters = n_units // u
    n_tiles = triton.cdiv(n, bn)
    split, per = _split(n_tiles, n_iters, x.device, cfg.get("split"), cfg.get("per_sm", _PROGRAMS_PER_SM[qtype]))
    part = torch.empty(split * n_tiles * mp * bn if split > 1 else 1, dtype=torch.float32, device=x.device)
    cnt = ticket_counters(x.device, n_tiles)
    args = (x2, raw, raw.view(torch.int16), out, part, cnt, m, n, n_iters, per, split,
            x2.stride(0), raw.stride(0), out.stride(0))
    if kind == "fma":
        _qgemv_kernel[(n_tiles, split)](*args, QT=qt, BN=bn, U=u, MP=m, MPAD=mp, SPLIT=split > 1,
                                        num_warps=warps, **pdl_launch(x.device))
    else:
        _qdot_kernel[(1, n_tiles, split)](*args, QT=qt, BM=16, BN=bn, U=u, SPLIT=split > 1, IEEE=_ieee(x),
                                          num_warps=warps)
    return out.reshape(*x.shape[:-1], n)


def qmatmul_fused_triton(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int, *, out: torch.Tensor | None = None,
                         config: dict | None = None) -> torch.Tensor:
    """The fused tensor-core GEMM for any number of rows (qmatmul_triton's path past 16 rows where
    gemm_triton's table says so). `config`: bm, bn, u, warps, stages, per_sm (split-K aims at that
    many programs a multiprocessor; 0: no split), split (programs along K, overriding per_sm)."""
    qt = _check(raw, qtype, k)
    x2 = _check_x(x, raw, k)
    m, n = x2.shape[0], raw.shape[0]
    out = _out(out, x, m, n)
    if m == 0 or n == 0:
        return out.reshape(*x.shape[:-1], n)
    bm, bn, u, warps, stages = _GEMM[qtype]
    cfg = config or {}
    bm, bn, u = cfg.get("bm", bm), cfg.get("bn", bn), cfg.get("u", u)
    warps, stages = cfg.get("warps", warps), cfg.get("stages", stages)
    if x.dtype == torch.float32:  # the IEEE float32 dot runs on CUDA cores: small tiles, no spills
        bm, bn, u, warps = 64, 64, 2, 4
    u = _units_per_step(k // 32, u)
    n_iters = k // 32 // u
    n_tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    split, per = 1, n_iters
    if cfg.get("split") is not None or cfg.get("per_sm"):
        split, per = _split(n_tiles, n_iters, x.device, cfg.get("split"), cfg.get("per_sm") or 1)
    part = torch.empty(split * n_tiles * bm * bn if split > 1 else 1, dtype=torch.float32, device=x.device)
    cnt = ticket_counters(x.device, n_tiles) if split > 1 else part
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), split)
    _qdot_kernel[grid](x2, raw, raw.view(torch.int16), out, part, cnt, m, n, n_iters, per, split,
                       x2.stride(0), raw.stride(0), out.stride(0),
                       QT=qt, BM=bm, BN=bn, U=u, SPLIT=split > 1, IEEE=_ieee(x), num_warps=warps, num_stages=stages)
    return out.reshape(*x.shape[:-1], n)


def qmatmul_dequant_triton(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int, *,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """dequantize_triton into a buffer of x's dtype, then torch.matmul (qmatmul_triton's path past
    16 rows where gemm_triton's table says so, and for float32 x)."""
    _check(raw, qtype, k)
    x2 = _check_x(x, raw, k)
    m, n = x2.shape[0], raw.shape[0]
    out = _out(out, x, m, n)
    w = dequantize_triton(raw, qtype, k, x.dtype)
    torch.matmul(x2, w.T, out=out)
    return out.reshape(*x.shape[:-1], n)


def qmatmul_triton(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int, *,
                   out: torch.Tensor | None = None, repacked: RepackedWeight | None = None) -> torch.Tensor:
    """x (..., k) @ W^T -> (..., N) in x.dtype, for any number of rows (see the module docstring).
    `out`, if given, is the contiguous (rows, N) result buffer; `repacked`, the weight's repacked
    layout where the load built one (used where the table measured it fastest)."""
    m = x.numel() // k if k else 0
    if 1 <= m <= 16:
        return qgemv_triton(x, raw, qtype, k, out=out)
    if x.dtype == torch.float32 or m == 0:
        # float32 x: cuBLAS's float32 GEMM beats the fused kernel's CUDA-core IEEE dot.
        return qmatmul_dequant_triton(x, raw, qtype, k, out=out)
    if repacked is not None and (rcfg := choose_repacked(qtype, m, raw.shape[0], k, x)) is not None:
        return repacked_matmul(x, repacked, rcfg, out=out)
    cfg = choose(qtype, m, raw.shape[0], k, x)  # gemm_triton.py's measured table
    if cfg is None:
        return qmatmul_dequant_triton(x, raw, qtype, k, out=out)
    return qmatmul_fused_triton(x, raw, qtype, k, out=out, config=cfg)
