"""The word-stream GEMV for GGUF blocks and x of 1..4 rows, in Triton (core_triton.qgemv_triton
dispatches here).

A program (one warp) owns R output channels and walks K in steps of 32 units of 64 weights, a
unit being a quarter super-block (K-quants) or two blocks (Q4_0, Q5_0, Q8_0); lane (s, u) of the
[1, 8, 4] lane grid takes unit 32 * step + 4 s + u. A unit is two streams of four 8-weight
pieces (Q4_K, Q5_K: low and high nibbles; Q8_0: its blocks) or four streams of two (Q6_K;
Q4_0/Q5_0: block and nibble), a stream being 32 or 16 weights of one scale whose x columns are
contiguous. Everything a lane holds is a [1, 8, 4] tensor, so rows, streams and pieces are
unrolled loops over separate tensors: each lane decodes its unit's scales once per row, loads its
x values once for all R rows (16-byte vectors), and reads the weights as 32-bit words (16-byte
vectors where the block layout allows; 2-byte aligned blocks funnel each word out of two).
A prepared word holds one value < 128 per byte, which one PRMT turns into the float
v = 0.5 + byte / 256 (`_byte_val`; Q8_0: the int8 itself, plus one add), so a weight costs about
one PRMT and one FMA per row of x. With w = D q - Mn and q = Z (v - 0.5), a stream's
sum_j x_j w_j is A sum(x v) - B sum(x) with A = Z D, B = A / 2 + Mn: scale work once per stream,
and sum(x) shared by the rows."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlxr.ops.backend import interpreting, ticket_counters
from mlxr.ops.pdl_triton import pdl_launch, wait_for_inputs
from mlxr.ops.quant.block_types import QUANT_TYPES
from mlxr.ops.quant.blocks_triton import FMA_MAX_M, _CODES, _finish, _split
from mlxr.ops.quant.wgemv_units_triton import _ws_piece, _ws_row, _ws_xcol
from mlxr.ops.quant.wgemv_words_triton import _byte_val, _split8

# The word-stream kernel (_wgemv_kernel) for 1..FMA_MAX_M rows: per type, (output channels per
# program, num_warps) by rows of x, and the programs split-K aims at per multiprocessor.
_WGEMV = {name: {1: (4, 1), 2: (4, 1), 3: (2, 1), 4: (2, 1)} for name in QUANT_TYPES}
_WGEMV_PER_SM = {name: 8 for name in _WGEMV}
_WALIGN = {"Q4_K": 4, "Q5_K": 4}  # row words are a multiple of this (vector loads); others 1


@triton.jit
def _dot8(acc, w0, w1, x, QT: tl.constexpr, ASM: tl.constexpr):
    """acc + sum_e v_e x[..., e] over the 8 byte values v of words w0, w1 ([1, 8, 4]; x [1, 8, 4, 8]):
    on the GPU one FMA chain over in-thread registers; interpreted, as vectors (fewer, larger ops)."""
    if ASM:
        xe = _split8(x)
        for e in tl.static_range(8):
            acc += _byte_val(w1 if e >= 4 else w0, e % 4, QT, ASM) * xe[e]
        return acc
    else:  # _byte_val's arithmetic on all 8 bytes at once
        b = tl.arange(0, 4)[None, None, None, :]
        v = tl.join(w0[:, :, :, None] >> (8 * b), w1[:, :, :, None] >> (8 * b)) & 0xFF  # [1, 8, 4, 4, 2]
        v = tl.reshape(tl.permute(v, (0, 1, 2, 4, 3)), (1, 8, 4, 8))
        if QT == 2:
            v = (v | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0
        else:
            v = ((v << 16) | 0x3F000000).to(tl.float32, bitcast=True)
        return acc + tl.sum(v * x, axis=3)


@triton.jit
def _sum8(acc, x, ASM: tl.constexpr):
    """acc + the sum of x [1, 8, 4, 8] over its last axis."""
    if ASM:
        xe = _split8(x)
        for e in tl.static_range(8):
            acc += xe[e]
        return acc
    else:
        return acc + tl.sum(x, axis=3)


@triton.jit
def _ws_step(accs, x_rows, w_rows, un, ok, QT: tl.constexpr, R: tl.constexpr, MP: tl.constexpr,
             ASM: tl.constexpr):
    """accs (index r * MP + m: row r of W, row m of x; [1, 8, 4] float32 each) plus units un."""
    NT: tl.constexpr = 2 if (QT == 2 or QT == 3 or QT == 4) else 4  # streams
    NW: tl.constexpr = 8 if (QT == 2 or QT == 3 or QT == 4) else 4  # words per stream, two per piece
    SX: tl.constexpr = QT != 2  # whether B is used (Q8_0's v is q itself)
    rows = ()
    for r in tl.static_range(R):
        rows = rows + (_ws_row(w_rows[r], un, ok, QT, ASM),)
    zero = tl.zeros([1, 8, 4], dtype=tl.float32)
    for t in tl.static_range(NT):
        xc = _ws_xcol(un, t, QT)
        pv = ()
        for i in tl.static_range(R * MP):
            pv = pv + (zero,)
        sx = (zero, zero, zero, zero)
        for p in tl.static_range(NW // 2):
            xs = ()
            for m in tl.static_range(MP):
                xs = xs + (tl.load(x_rows[m] + xc + 8 * p).to(tl.float32),)
            if SX:
                nsx = ()
                for m in tl.static_range(MP):
                    nsx = nsx + (_sum8(sx[m], xs[m], ASM),)
                sx = nsx
            npv = ()
            for r in tl.static_range(R):
                w0, w1 = _ws_piece(rows[r][1], t, p, QT)
                for m in tl.static_range(MP):
                    npv = npv + (_dot8(pv[r * MP + m], w0, w1, xs[m], QT, ASM),)
            pv = npv
        nacc = ()
        for r in tl.static_range(R):
            a, b = rows[r][0][t]
            for m in tl.static_range(MP):
                c = a * pv[r * MP + m]
                if SX:
                    c -= b * sx[m]
                nacc = nacc + (accs[r * MP + m] + c,)
        accs = nacc
    return accs


@triton.jit
def _wgemv_kernel(x_ptr, w_ptr, out_ptr, part_ptr, cnt_ptr, M, N, n_units, steps_per_split, n_split,
                  stride_xm, stride_w, stride_om,
                  QT: tl.constexpr, R: tl.constexpr, MP: tl.constexpr, MPAD: tl.constexpr, SPLIT: tl.constexpr,
                  WALIGN: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr):
    """out[m, n] = sum_k x[m, k] w[n, k] for m < M == MP <= 4 (MPAD: MP padded to a power of two),
    one warp, the word-stream walk (see its section): n_units = K / 64. stride_w: row words / WALIGN."""
    wait_for_inputs(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    wp = w_ptr.to(tl.pointer_type(tl.uint32))
    w_rows = ()
    for r in tl.static_range(R):
        w_rows = w_rows + (wp + tl.minimum(pid_n * R + r, N - 1).to(tl.int64) * stride_w * WALIGN,)
    x_rows = ()
    for m in tl.static_range(MP):
        x_rows = x_rows + (x_ptr + m * stride_xm,)
    lane = tl.arange(0, 8)[None, :, None] * 4 + tl.arange(0, 4)[None, None, :]
    accs = ()
    for i in tl.static_range(R * MP):
        accs = accs + (tl.zeros([1, 8, 4], dtype=tl.float32),)
    it0 = pid_k * steps_per_split
    it1 = tl.minimum(it0 + steps_per_split, tl.cdiv(n_units, 32))
    for it in range(it0, it1):
        un = it * 32 + lane
        # Lanes past the last unit re-read it (no masked loads) and count for 0.
        accs = _ws_step(accs, x_rows, w_rows, tl.minimum(un, n_units - 1), un < n_units, QT, R, MP, ASM)
    m2 = tl.arange(0, MPAD)[:, None]
    r2 = tl.arange(0, R)[None, :]
    res = tl.zeros([MPAD, R], dtype=tl.float32)
    for r in tl.static_range(R):
        for m in tl.static_range(MP):
            res = tl.where((m2 == m) & (r2 == r), tl.sum(accs[r * MP + m]), res)
    n2 = pid_n * R + r2
    out_ptrs = out_ptr + m2 * stride_om + n2
    _finish(res, out_ptrs, (m2 < M) & (n2 < N), part_ptr, cnt_ptr, pid_n, tl.num_programs(0), pid_k, n_split,
            MPAD, R, SPLIT)


def wgemv_fits(raw: torch.Tensor, qtype: str, m: int) -> bool:
    """Whether the word-stream kernel takes this weight: its types, whole-word rows, aligned base."""
    return (qtype in _WGEMV and m <= FMA_MAX_M and raw.shape[1] % (4 * _WALIGN.get(qtype, 1)) == 0
            and raw.data_ptr() % 16 == 0)


def wgemv_triton(x2: torch.Tensor, raw: torch.Tensor, qtype: str, k: int, out: torch.Tensor, cfg: dict) -> torch.Tensor:
    m, n = x2.shape[0], raw.shape[0]
    r, warps = _WGEMV[qtype][m]
    r, warps = cfg.get("bn", r), cfg.get("warps", warps)
    mp = triton.next_power_of_2(m)
    n_units = k // 64
    n_tiles = triton.cdiv(n, r)
    split, per = _split(n_tiles, triton.cdiv(n_units, 32), x2.device, cfg.get("split"),
                        cfg.get("per_sm", _WGEMV_PER_SM[qtype]))
    walign = _WALIGN.get(qtype, 1)
    part = torch.empty(split * n_tiles * mp * r if split > 1 else 1, dtype=torch.float32, device=x2.device)
    cnt = ticket_counters(x2.device, n_tiles)
    _wgemv_kernel[(n_tiles, split)](x2, raw, out, part, cnt, m, n, n_units, per, split,
                                    x2.stride(0), raw.stride(0) // (4 * walign), out.stride(0),
                                    QT=_CODES[qtype], R=r, MP=m, MPAD=mp, SPLIT=split > 1,
                                    WALIGN=walign, ASM=cfg.get("asm", not interpreting()), num_warps=warps,
                                    **pdl_launch(x2.device))
    return out
