"""Triton kernels for the extra types kept quantized (GGUF's Q4_1, Q5_1, Q2_K, Q3_K, IQ4_NL,
IQ4_XS; bitsandbytes' NF4), on weights in their raw block layout (block_types.py).

Each weight is computed from gathers by its column: block = col // block_elems, then the type's
fields (quant bytes one by one, a block's fp16/fp32 scales as one 16- or 32-bit word). Every
product of the dequantization is exact in float32 (an fp16 significand of 11 bits times scale
and quant integers stays under 24 bits), so a contracted multiply-add rounds as gguf-py's
separate operations do: the float32 output is bit-exact to gguf-py (NF4: one float32 product,
as bitsandbytes rounds it).
- M <= GEMV_MAX_M rows of x: `_gemv_kernel`, for any K (a multiple of the type's block, so of
  32): one program per BN output channels (and per share of K's tiles, split-K) takes every row
  of x, so each weight byte is read and dequantized once per step whatever the batch; each row
  keeps its own float32 accumulator of the [BN, BK] tile. The K tile (gemv_tile_k: 64 or 32 columns) and the
  launch (gemv_config) depend on the weight's shape and the device, never on M; no sum runs across
  rows: a row's output is bit-identical alone or inside any batch of up to 16 (speculative
  decoding's verify rows must match a plain decode row; the tests check it, and that the sm_90
  code reduces a row from the same layouts at 1, 9 and 16 rows). Q4_1 (SmolLM2's type) takes
  its tile from 32-bit quant words (q4_1_triton.py; `_q4_1_tile`: 8 weights a load and a
  thread, its scales once a block; the compiler then moves the tile through shared memory into
  the accumulators' layout): its sm_90 loop is 67 instructions for 8 weights a thread at one row
  where the per-weight gathers take 180. By default the same words are split into their low and
  high nibbles (`_q4_1_halves`), two accumulators a row, so each half's columns are contiguous
  and x is read in vector loads (a verify row of 9: 2 loads a row and tile instead of 8).
  Launched with programmatic dependent launch (pdl_triton.py), as the other decode kernels are.
- More rows: `dequantize_extra_triton` into a buffer of x's dtype, then torch.matmul (the
  same choice as core_triton.py's GEMM_DEQUANT_MIN_M for the core types).
bench/probes/extra_gemv.py sweeps the GEMV's launch at SmolLM2's shapes (the choice of
_GEMV_BN and _GEMV_WARPS); bench/kernels/quant_extra.py --device cuda measures the types.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from mlxr.ops.backend import sm_count, ticket_counters
from mlxr.ops.pdl_triton import pdl_launch, wait_for_inputs
from mlxr.ops.quant.block_types import EXTRA_TYPES
from mlxr.ops.quant.blocks_triton import _finish, _half
from mlxr.ops.quant.q4_1_triton import _accumulate_halves, _q4_1_halves, _q4_1_tile
from mlxr.ops.quant.reference_extra import IQ4_KVALUES, NF4_VALUES

GEMV_MAX_M = 16
_BN, _BK = 16, 256  # the dequantize kernel's tile
# 16 channels over 4 warps (8 weights a thread): on an H200 SmolLM2's four GEMVs summed over a step
# took 482 / 716 / 1,048 us at 1 / 5 / 9 rows of x, against 589 / 1,069 / 1,601 for 8 channels over
# 2 warps, whose per-row reductions grew faster with the rows (bench/probes/extra_gemv.py,
# extra_gemv-20261128T004320Z and -004532Z; the flattest, 8 over 1 warp, costs 665 at one row).
_GEMV_BN, _GEMV_WARPS = 16, 4
_PROGRAMS_PER_SM = 4  # split-K's aim (gemv_config)
# Q4_1's tile in two halves, each row of x read in 16-byte loads (_q4_1_halves) rather than a
# float at a time: SmolLM2's four GEMVs summed over a step on an H200 took 494 / 706 / 969 us at
# 1 / 5 / 9 rows against 494 / 726 / 1,055 with the one-tile order (bench/probes/extra_gemv.py,
# extra_gemv-20261128T200213Z; bf16 x, weights cycled past L2). MLXR_Q4_1_HALVES=0 or config
# "halves" picks the one-tile order.
Q4_1_HALVES = os.environ.get("MLXR_Q4_1_HALVES", "1") != "0"
_KVALUES: dict[torch.device, torch.Tensor] = {}


@triton.jit
def _u8(p):
    return tl.load(p).to(tl.int32)


@triton.jit
def _f16(h_ptr, off):
    """The fp16 at byte offset off (even), read as one 16-bit word."""
    return _half(tl.load(h_ptr + off // 2))


@triton.jit
def _f16_pair(v_ptr, off):
    """The two fp16 at byte offset off (a multiple of 4), read as one 32-bit word."""
    word = tl.load(v_ptr + off // 4)
    return _half(word), _half(word >> 16)


@triton.jit
def _nibble(p, i):
    """Element i of 32 from 16 bytes at p: low nibbles first, then high."""
    b = _u8(p + (i % 16))
    return tl.where(i < 16, b & 15, b >> 4)


@triton.jit
def _two_bits(p, i):
    """Element i of 256 from 64 bytes at p: byte (i // 128) * 32 + i % 32, shift 2 * ((i % 128) // 32)."""
    return (_u8(p + (i // 128) * 32 + (i % 32)) >> (2 * ((i % 128) // 32))) & 3


@triton.jit
def _weights(w_ptr, h_ptr, v_ptr, kv_ptr, rb, col, QT: tl.constexpr):
    """Float32 weights at byte-row offsets rb [BN, 1] and columns col [1, BK]. The same bytes
    are also seen as 16-bit words (h_ptr) and, for types whose blocks are a multiple of 4 bytes,
    32-bit words (v_ptr): a block's fp16/fp32 fields take one load, not one a byte."""
    if QT == 6:  # Q4_1: d, m, 16 bytes of nibbles
        off = rb + (col // 32) * 20
        d, m = _f16_pair(v_ptr, off)
        v = d * _nibble(w_ptr + off + 4, col % 32).to(tl.float32) + m
    elif QT == 7:  # Q5_1: d, m, 32 high bits (one little-endian word), 16 bytes of nibbles
        off = rb + (col // 32) * 24
        i = col % 32
        d, m = _f16_pair(v_ptr, off)
        high = (tl.load(v_ptr + off // 4 + 1) >> i) & 1
        v = d * (_nibble(w_ptr + off + 8, i) | (high << 4)).to(tl.float32) + m
    elif QT == 8:  # Q2_K
        off = rb + (col // 256) * 84
        i = col % 256
        sc = _u8(w_ptr + off + i // 16)
        d, dmin = _f16_pair(v_ptr, off + 80)
        dl = d * (sc & 15).to(tl.float32)
        ml = dmin * (sc >> 4).to(tl.float32)
        v = dl * _two_bits(w_ptr + off + 16, i).to(tl.float32) - ml
    elif QT == 9:  # Q3_K (110-byte blocks: 16-bit words only)
        off = rb + (col // 256) * 110
        base = w_ptr + off
        i = col % 256
        s = i // 16
        low = tl.where(s < 8, _u8(base + 96 + (s % 8)) & 15, _u8(base + 96 + (s % 8)) >> 4)
        high = (_u8(base + 104 + s % 4) >> (2 * (s // 4))) & 3
        dl = _f16(h_ptr, off + 108) * ((low | (high << 4)) - 32).to(tl.float32)
        hb = (_u8(base + i % 32) >> (i // 32)) & 1
        v = dl * (_two_bits(base + 32, i) - 4 * (1 - hb)).to(tl.float32)
    elif QT == 12:  # NF4: float32 absmax, element 2j in the high nibble of byte j
        off = rb + (col // 64) * 36
        i = col % 64
        absmax = tl.load(v_ptr + off // 4).to(tl.float32, bitcast=True)
        b = _u8(w_ptr + off + 4 + i // 2)
        q = tl.where(i % 2 == 0, b >> 4, b & 15)
        v = tl.load(kv_ptr + 16 + q) * absmax
    elif QT == 10:  # IQ4_NL (18-byte blocks: 16-bit words only)
        off = rb + (col // 32) * 18
        v = _f16(h_ptr, off) * tl.load(kv_ptr + _nibble(w_ptr + off + 2, col % 32))
    else:  # IQ4_XS: d and the 16 high scale bits in one word
        off = rb + (col // 256) * 136
        i = col % 256
        s = i // 32
        word = tl.load(v_ptr + off // 4)
        low = (_u8(w_ptr + off + 4 + s // 2) >> (4 * (s % 2))) & 15
        high = (word >> (16 + 2 * s)) & 3
        dl = _half(word) * ((low | (high << 4)) - 32).to(tl.float32)
        v = dl * tl.load(kv_ptr + _nibble(w_ptr + off + 8 + s * 16, i % 32))
    return v


@triton.jit
def _dequant_kernel(w_ptr, h_ptr, v_ptr, kv_ptr, out_ptr, N, K, stride_w, stride_o,
                    QT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    ok = (rows < N)[:, None] & (cols < K)[None, :]
    rb = (tl.minimum(rows, N - 1).to(tl.int64) * stride_w)[:, None]
    v = _weights(w_ptr, h_ptr, v_ptr, kv_ptr, rb, tl.minimum(cols, K - 1)[None, :], QT)
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_o + cols[None, :]
    tl.store(out, v.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _row_copies(zero, MB: tl.constexpr):
    """MB zero tiles like `zero`: one accumulator per row of x."""
    accs = ()
    for _ in tl.static_range(MB):
        accs = accs + (zero,)
    return accs


@triton.jit
def _accumulate_rows(accs, w, x_ptrs, stride_x, MB: tl.constexpr):
    """Row r's accumulator += the weight tile times row r's x at x_ptrs (broadcast over channels)."""
    out = ()
    for r in tl.static_range(MB):
        out = out + (accs[r] + w * tl.load(x_ptrs + r * stride_x).to(tl.float32),)
    return out


@triton.jit
def _channel_sums(acc, QT: tl.constexpr):
    """[BN]: one accumulator's sums by output channel (Q4_1's tiles are [BN, NB, 4, 8])."""
    if QT == 6:
        sums = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=1)
    else:
        sums = tl.sum(acc, axis=1)
    return sums


@triton.jit
def _row_total(accs, r: tl.constexpr, QT: tl.constexpr, HALVES: tl.constexpr):
    """[BN]: row r's channel sums (HALVES: its two accumulators', low half first)."""
    if HALVES:  # each half is 4-D like Q4_1's one tile, summed the same way
        total = _channel_sums(accs[2 * r], QT) + _channel_sums(accs[2 * r + 1], QT)
    else:
        total = _channel_sums(accs[r], QT)
    return total


@triton.jit
def _row_sums(accs, QT: tl.constexpr, MB: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr, HALVES: tl.constexpr):
    """[MP, BN]: row r holds its channel sums (selected, not added: exact)."""
    r2 = tl.arange(0, MP)[:, None]
    res = tl.zeros([MP, BN], dtype=tl.float32)
    for r in tl.static_range(MB):
        res = tl.where(r2 == r, _row_total(accs, r, QT, HALVES)[None, :], res)
    return res


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, h_ptr, v_ptr, kv_ptr, out_ptr, part_ptr, cnt_ptr, N, n_iters, iters_per_split, n_split,
                 stride_x, stride_w, stride_o,
                 QT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, MB: tl.constexpr, MP: tl.constexpr,
                 SPLIT: tl.constexpr, PDL: tl.constexpr, HALVES: tl.constexpr):
    """out[r, n] for the MB rows of x and BN output channels over this program's share of K's
    tiles: each weight tile is dequantized once and multiplied into every row's own accumulator
    of the tile's shape, each reduced alone at the end. No tensor of the sums has a rows dimension, so
    a row's arithmetic (its loads, the tile's layout, its reduction) is the same code whatever
    MB is: row r's output is bit-identical for any MB. Split-K (SPLIT): the tile's last program
    adds the splits' [MP, BN] partials in split order (blocks_triton._finish), also the
    same for every MB."""
    wait_for_inputs(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BN + tl.arange(0, BN)
    rb = (tl.minimum(rows, N - 1).to(tl.int64) * stride_w)[:, None]
    if HALVES:
        accs = _row_copies(tl.zeros([BN, BK // 32, 4, 4], dtype=tl.float32), 2 * MB)
    elif QT == 6:
        accs = _row_copies(tl.zeros([BN, BK // 32, 4, 8], dtype=tl.float32), MB)
    else:
        accs = _row_copies(tl.zeros([BN, BK], dtype=tl.float32), MB)
    it0 = pid_k * iters_per_split
    for it in range(it0, tl.minimum(it0 + iters_per_split, n_iters)):
        if HALVES:
            lo, hi, cols = _q4_1_halves(v_ptr, rb, it * (BK // 32), BK // 32)
            accs = _accumulate_halves(accs, lo, hi, x_ptr + cols, stride_x, MB)
        else:
            if QT == 6:
                w, cols = _q4_1_tile(v_ptr, rb, it * (BK // 32), BK // 32)
            else:
                cols = (it * BK + tl.arange(0, BK))[None, :]
                w = _weights(w_ptr, h_ptr, v_ptr, kv_ptr, rb, cols, QT)
            accs = _accumulate_rows(accs, w, x_ptr + cols, stride_x, MB)
    if SPLIT:
        r2 = tl.arange(0, MP)[:, None]
        n2 = rows[None, :]
        _finish(_row_sums(accs, QT, MB, MP, BN, HALVES), out_ptr + r2 * stride_o + n2, (r2 < MB) & (n2 < N), part_ptr,
                cnt_ptr, pid_n, tl.num_programs(0), pid_k, n_split, MP, BN, SPLIT)
    else:
        for r in tl.static_range(MB):
            out = _row_total(accs, r, QT, HALVES)
            tl.store(out_ptr + r * stride_o + rows, out.to(out_ptr.dtype.element_ty), mask=rows < N)


def _kvalues(device: torch.device) -> torch.Tensor:
    if device not in _KVALUES:
        # IQ4's grid, then the NF4 code (entries 16..31)
        _KVALUES[device] = torch.tensor(IQ4_KVALUES + NF4_VALUES, dtype=torch.float32, device=device)
    return _KVALUES[device]


def _word_views(raw: torch.Tensor, qtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """raw as 16-bit words, and as 32-bit words where the type's blocks are a multiple of 4 bytes
    (else the 16-bit view again, unread): _weights' h_ptr and v_ptr. Every block is 2-byte aligned."""
    h = raw.view(torch.int16)
    return h, raw.view(torch.int32) if EXTRA_TYPES[qtype].block_bytes % 4 == 0 else h


def _check(raw: torch.Tensor, qtype: str, k: int) -> int:
    t = EXTRA_TYPES[qtype]
    assert raw.dtype == torch.uint8 and raw.dim() == 2 and raw.stride(1) == 1, (raw.dtype, raw.shape)
    assert raw.shape[1] == t.row_bytes(k), (tuple(raw.shape), qtype, k)
    return t.code


def dequantize_extra_triton(raw: torch.Tensor, qtype: str, k: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The (n, k) weight in `dtype` (float32: bit-exact to gguf-py)."""
    code = _check(raw, qtype, k)
    n = raw.shape[0]
    out = torch.empty(n, k, dtype=dtype, device=raw.device)
    grid = (triton.cdiv(n, _BN), triton.cdiv(k, _BK))
    _dequant_kernel[grid](raw, *_word_views(raw, qtype), _kvalues(raw.device), out, n, k, raw.stride(0),
                          out.stride(0), QT=code, BN=_BN, BK=_BK)
    return out


def gemv_tile_k(k: int) -> int:
    """The GEMV's K tile: 64 columns where they divide K, else 32 (every type's K is a multiple of
    32). It depends on K alone, never on the rows of x (a row's sums must not change with the
    batch); and it stays small because each row of x keeps its own [BN, BK] accumulator in
    registers (16 rows of [16, 64] over 4 warps: 128 of them a thread)."""
    return 64 if k % 64 == 0 else 32


def gemv_config(n: int, k: int, device: torch.device, config: dict | None = None) -> tuple[int, int, int, int, int]:
    """(BN, BK, num_warps, split, tiles per split) of the GEMV for an (n, k) weight, the same for
    every row count: BN and num_warps shape the tile's register layout and with it each row's
    reduction order, and the split where the partial sums meet. Split-K by default where the
    channel tiles alone leave the device short of _PROGRAMS_PER_SM programs a multiprocessor
    (SmolLM2's 576..3072 channels: 72..384 tiles). `config` (benchmarks) overrides bn, bk (must
    divide k), warps and split."""
    cfg = config or {}
    bn, bk, warps = cfg.get("bn", _GEMV_BN), cfg.get("bk", gemv_tile_k(k)), cfg.get("warps", _GEMV_WARPS)
    assert k % bk == 0, (k, bk)
    n_iters = k // bk
    split = cfg.get("split")
    if split is None:
        want = _PROGRAMS_PER_SM * sm_count(device)
        n_tiles = triton.cdiv(n, bn)
        split = 1 if n_tiles >= want else -(-want // n_tiles)
    per = -(-n_iters // max(1, min(split, n_iters)))
    return bn, bk, warps, -(-n_iters // per), per


def qmatmul_extra_triton(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int, *,
                         config: dict | None = None) -> torch.Tensor:
    """x (..., k) @ W^T -> (..., n) in x.dtype, float32 accumulation. `config`: gemv_config's."""
    code = _check(raw, qtype, k)
    assert x.shape[-1] == k and x.device == raw.device, (tuple(x.shape), k)
    rows = x.reshape(-1, k)
    m, n = rows.shape[0], raw.shape[0]
    if m > GEMV_MAX_M:
        w = dequantize_extra_triton(raw, qtype, k, x.dtype)
        return (rows @ w.T).reshape(*x.shape[:-1], n)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out.reshape(*x.shape[:-1], n)
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    bn, bk, warps, split, per = gemv_config(n, k, x.device, config)
    n_tiles, mp = triton.cdiv(n, bn), triton.next_power_of_2(m)
    part = torch.empty(split * n_tiles * mp * bn if split > 1 else 1, dtype=torch.float32, device=x.device)
    _gemv_kernel[(n_tiles, split)](rows, raw, *_word_views(raw, qtype), _kvalues(raw.device), out, part,
                                   ticket_counters(x.device, n_tiles), n, k // bk, per, split, rows.stride(0),
                                   raw.stride(0), out.stride(0), QT=code, BN=bn, BK=bk, MB=m, MP=mp,
                                   SPLIT=split > 1, HALVES=code == 6 and (config or {}).get("halves", Q4_1_HALVES),
                                   num_warps=warps, **pdl_launch(x.device))
    return out.reshape(*x.shape[:-1], n)
