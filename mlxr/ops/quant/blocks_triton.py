"""Device helpers shared by the GGUF block kernels (core_triton.py, wgemv_triton.py):
decoding a weight tile from its raw blocks, the split-K tail and its host-side split
(`_split`), and the row limit of the CUDA-core GEMVs (FMA_MAX_M).

How a tile is read. Every type is walked in *units* of 32 weights (one block of the 32-weight
types, one eighth of a K-quant super-block). A program loads, per unit and row, one run of 16
quant bytes (plus the scales) and unpacks it into two *pieces* of 16 weights each, the low and
the high nibbles (for Q8_0 the two halves of the block), each paired with the 16 activation
columns it multiplies. So each weight byte is read once, the bytes of a run are contiguous (16-byte
loads where the block layout is 16-byte aligned: Q4_K, Q5_K; 2-byte otherwise), and a tile is a
3-D block [rows, units, 16] whose scales are [rows, units, 1] broadcasts. Quants become floats
exactly through the exponent trick `bitcast(0x4B000000 | q) - 2**23` (one logic op and one add,
instead of the slow integer-to-float conversion).

Split-K (`_finish`): when the output channels give too few programs to fill the GPU, the K
walk is split across programs; each writes a float32 partial tile, and the last program of a
tile (found by an atomic counter that it resets) sums the partials in split order and writes
the output, so the result is deterministic and there is one launch. The counters are one int32
buffer per device (backend.ticket_counters): kernels on different streams must not run
split-K launches concurrently.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlxr.ops.backend import sm_count
from mlxr.ops.quant.block_types import QUANT_TYPES

_CODES = {name: t.code for name, t in QUANT_TYPES.items()}  # Q4_0 0, Q5_0 1, Q8_0 2, Q4_K 3, Q5_K 4, Q6_K 5
# Rows of x the CUDA-core FMA kernel can take (per type, core_triton's _FMA_ROWS picks; above:
# tensor cores); the word-stream GEMV (wgemv_triton.py) takes up to as many.
FMA_MAX_M = 4


def _split(n_tiles: int, n_iters: int, device: torch.device, split: int | None, per_sm: int) -> tuple[int, int]:
    """(programs along K, steps each): enough programs for the GPU, no empty split."""
    if split is None:
        want = per_sm * sm_count(device)
        split = 1 if n_tiles >= want else -(-want // n_tiles)
    split = max(1, min(split, n_iters))
    per = -(-n_iters // split)
    return -(-n_iters // per), per


@triton.jit
def _qf(q, OFFSET: tl.constexpr):
    """float32(q - OFFSET), exact for 0 <= q < 2**23: 2**23 + q assembled in the bits, minus."""
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET)


@triton.jit
def _k_scale_min(b0, b1, b2, s):
    """Q4_K/Q5_K: sub-block s's 6-bit scale and min from packed bytes s & 3, (s & 3) + 4, (s & 3) + 8."""
    upper = s >= 4
    sc = tl.where(upper, (b2 & 15) | ((b0 >> 6) << 4), b0 & 63)
    mn = tl.where(upper, (b2 >> 4) | ((b1 >> 6) << 4), b1 & 63)
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _cols(unit, j, QT: tl.constexpr):
    """Columns (within the row) of the low and high piece of `unit` (32 weights), lane j < 16."""
    if QT == 3 or QT == 4:  # Q4_K, Q5_K: sub-blocks 2g (low nibbles) and 2g+1 (high)
        v = unit & 7
        lo = (unit >> 3) * 256 + (v >> 1) * 64 + (v & 1) * 16 + j
        hi = lo + 32
    elif QT == 5:  # Q6_K: halves of 128; low nibbles first 64, high nibbles next 64
        v = unit & 7
        lo = (unit >> 3) * 256 + (v >> 2) * 128 + (v & 3) * 16 + j
        hi = lo + 64
    else:  # Q4_0, Q5_0, Q8_0: a block is one unit; lanes j and 16 + j
        lo = unit * 32 + j
        hi = lo + 16
    return lo, hi


@triton.jit
def _raw(w_ptr, h_ptr, rb, unit, j, QT: tl.constexpr):
    """Every load `unit` needs, undecoded (10 slots, unused ones repeat the first), so that a loop
    can issue the next step's loads before it decodes this step's.

    rb: [BN, 1, 1] int64 row byte offsets; unit: [1, U, 1]; j: [1, 1, 16].
    """
    if QT == 0:  # Q4_0: fp16 d, 16 bytes of nibbles
        blk = rb + unit * 18
        d = tl.load(h_ptr + (blk >> 1))
        b = tl.load(w_ptr + blk + 2 + j)
        return d, b, d, d, d, d, d, d, d, d
    elif QT == 1:  # Q5_0: fp16 d, 32 high bits (two 16-bit halves), 16 bytes of nibbles
        blk = rb + unit * 22
        d = tl.load(h_ptr + (blk >> 1))
        qa = tl.load(h_ptr + (blk >> 1) + 1)
        qb = tl.load(h_ptr + (blk >> 1) + 2)
        b = tl.load(w_ptr + blk + 6 + j)
        return d, b, qa, qb, d, d, d, d, d, d
    elif QT == 2:  # Q8_0: fp16 d, 32 int8
        blk = rb + unit * 34
        d = tl.load(h_ptr + (blk >> 1))
        b_lo = tl.load(w_ptr + blk + 2 + j)
        b_hi = tl.load(w_ptr + blk + 18 + j)
        return d, b_lo, b_hi, d, d, d, d, d, d, d
    elif QT == 3 or QT == 4:  # Q4_K/Q5_K: d, dmin, 12 scale bytes, (Q5_K: 32 bytes of high bits), nibbles
        v = unit & 7
        blk = rb + (unit >> 3) * (144 + 32 * (QT - 3))  # block bytes: 144 (Q4_K), 176 (Q5_K)
        d = tl.load(h_ptr + (blk >> 1))
        dmin = tl.load(h_ptr + (blk >> 1) + 1)
        i_lo = (v >> 1) * 2 & 3  # sub-blocks 2g and 2g + 1 (g = v >> 1): packed bytes s & 3, +4, +8
        sp = w_ptr + blk + 4
        l0 = tl.load(sp + i_lo)
        l1 = tl.load(sp + i_lo + 4)
        l2 = tl.load(sp + i_lo + 8)
        h0 = tl.load(sp + i_lo + 1)
        h1 = tl.load(sp + i_lo + 5)
        h2 = tl.load(sp + i_lo + 9)
        if QT == 3:
            b = tl.load(w_ptr + blk + 16 + v * 16 + j)
            qh = b
        else:
            b = tl.load(w_ptr + blk + 48 + v * 16 + j)
            qh = tl.load(w_ptr + blk + 16 + (v & 1) * 16 + j)
        return d, dmin, l0, l1, l2, h0, h1, h2, b, qh
    else:  # Q6_K: 128 low-nibble bytes, 64 bytes of 2-bit highs, 16 int8 scales, fp16 d
        v = unit & 7
        blk = rb + (unit >> 3) * 210
        d = tl.load(h_ptr + ((blk + 208) >> 1))
        half = v >> 2
        b = tl.load(w_ptr + blk + v * 16 + j)
        qh = tl.load(w_ptr + blk + 128 + half * 32 + (v & 1) * 16 + j)
        s_lo = half * 8 + (v & 3)
        sc_lo = tl.load(w_ptr + blk + 192 + s_lo)
        sc_hi = tl.load(w_ptr + blk + 196 + s_lo)
        return d, b, qh, sc_lo, sc_hi, d, d, d, d, d


@triton.jit
def _half(bits):
    """The fp16 in the low 16 bits of an integer, as float32."""
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _f16(bits):
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _deq(r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, unit, j, QT: tl.constexpr):
    """Dequantized float32 low and high pieces [BN, U, 16] of `unit` from _raw's loads.

    Same arithmetic (and, products being exact, the same float32 results) as gguf-py.
    """
    if QT == 0:  # d * (q - 8)
        d = _f16(r0)
        b = r1.to(tl.int32)
        lo = d * _qf(b & 15, 8.0)
        hi = d * _qf(b >> 4, 8.0)
    elif QT == 1:  # d * (q - 16)
        d = _f16(r0)
        qa = r2.to(tl.int32) & 0xFFFF  # bits 0..15 of qh
        qb = r3.to(tl.int32) & 0xFFFF  # bits 16..31
        b = r1.to(tl.int32)
        lo = d * _qf((b & 15) | (((qa >> j) & 1) << 4), 16.0)
        hi = d * _qf((b >> 4) | (((qb >> j) & 1) << 4), 16.0)
    elif QT == 2:  # q * d
        d = _f16(r0)
        lo = _qf(r1.to(tl.int32) ^ 128, 128.0) * d
        hi = _qf(r2.to(tl.int32) ^ 128, 128.0) * d
    elif QT == 3 or QT == 4:  # (d * sc) * q - dmin * m per sub-block of 32
        d = _f16(r0)
        dmin = _f16(r1)
        g2 = ((unit & 7) >> 1) * 2
        sc_lo, m_lo = _k_scale_min(r2.to(tl.int32), r3.to(tl.int32), r4.to(tl.int32), g2)
        sc_hi, m_hi = _k_scale_min(r5.to(tl.int32), r6.to(tl.int32), r7.to(tl.int32), g2 + 1)
        b = r8.to(tl.int32)
        if QT == 3:
            q_lo = b & 15
            q_hi = b >> 4
        else:
            qh = r9.to(tl.int32)
            q_lo = (b & 15) | (((qh >> g2) & 1) << 4)
            q_hi = (b >> 4) | (((qh >> (g2 + 1)) & 1) << 4)
        lo = (d * sc_lo) * _qf(q_lo, 0.0) - dmin * m_lo
        hi = (d * sc_hi) * _qf(q_hi, 0.0) - dmin * m_hi
    else:  # Q6_K: (d * sc) * (q - 32)
        d = _f16(r0)
        b = r1.to(tl.int32)
        qh = r2.to(tl.int32)
        shift = (((unit & 7) >> 1) & 1) * 2
        sc_lo = r3.to(tl.int8, bitcast=True).to(tl.float32)
        sc_hi = r4.to(tl.int8, bitcast=True).to(tl.float32)
        lo = (d * sc_lo) * _qf((b & 15) | (((qh >> shift) & 3) << 4), 32.0)
        hi = (d * sc_hi) * _qf((b >> 4) | (((qh >> (shift + 4)) & 3) << 4), 32.0)
    return lo, hi


@triton.jit
def _pieces(w_ptr, h_ptr, rb, unit, j, QT: tl.constexpr):
    """_deq(_raw(...)): the dequantized float32 low and high pieces of `unit`."""
    r0, r1, r2, r3, r4, r5, r6, r7, r8, r9 = _raw(w_ptr, h_ptr, rb, unit, j, QT)
    return _deq(r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, unit, j, QT)


@triton.jit
def _finish(res, out_ptrs, omask, part_ptr, cnt_ptr, tile, n_tiles, pid_k, n_split,
            A: tl.constexpr, B: tl.constexpr, SPLIT: tl.constexpr):
    """Store the [A, B] float32 result, or (split-K) its partial; the tile's last program sums."""
    if not SPLIT:
        tl.store(out_ptrs, res.to(out_ptrs.dtype.element_ty), mask=omask)
    else:
        loc = tl.arange(0, A)[:, None] * B + tl.arange(0, B)[None, :]
        base = part_ptr + tile.to(tl.int64) * (A * B)
        stride = n_tiles.to(tl.int64) * (A * B)
        tl.store(base + pid_k * stride + loc, res)
        tl.debug_barrier()  # every thread's partial is written before the release below
        done = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if done == n_split - 1:
            total = tl.zeros([A, B], dtype=tl.float32)
            for s in range(n_split):
                total += tl.load(base + s * stride + loc, cache_modifier=".cg")
            tl.store(out_ptrs, total.to(out_ptrs.dtype.element_ty), mask=omask)
            tl.atomic_xchg(cnt_ptr + tile, 0)  # ready for the next launch
