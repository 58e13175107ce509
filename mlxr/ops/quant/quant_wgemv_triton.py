"""The word-stream GEMV for GGUF blocks and x of 1..4 rows, in Triton (quant_triton.qgemv_triton
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
from mlxr.ops.quant.quant_blocks_triton import _CODES, _finish
from mlxr.ops.quant.quant_triton import FMA_MAX_M, _split
from mlxr.ops.quant.quant_types import QUANT_TYPES

# The word-stream kernel (_wgemv_kernel) for 1..FMA_MAX_M rows: per type, (output channels per
# program, num_warps) by rows of x, and the programs split-K aims at per multiprocessor.
_WGEMV = {name: {1: (4, 1), 2: (4, 1), 3: (2, 1), 4: (2, 1)} for name in QUANT_TYPES}
_WGEMV_PER_SM = {name: 8 for name in _WGEMV}
_WALIGN = {"Q4_K": 4, "Q5_K": 4}  # row words are a multiple of this (vector loads); others 1


@triton.jit
def _byte_val(word, b: tl.constexpr, QT: tl.constexpr, ASM: tl.constexpr):
    """Byte b of each prepared uint32 word as float32: for Q8_0 (bytes q ^ 0x80) the int8 q, else
    (bytes < 128) 0.5 + byte / 256, the byte placed at bits 16..23 under the exponent byte 0x3F."""
    if QT == 2:  # 2**23 + byte, assembled in the bits, minus 2**23 + 128
        if ASM:
            bits = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0x4B000000, $2;", "=r,r,r", [word, 0x7540 + b],
                                             dtype=tl.uint32, is_pure=True, pack=1)
        else:
            bits = ((word >> (8 * b)) & 0xFF) | 0x4B000000
        return bits.to(tl.float32, bitcast=True) - 8388736.0
    else:
        if ASM:
            bits = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0x3F000000, $2;", "=r,r,r", [word, 0x7044 + 256 * b],
                                             dtype=tl.uint32, is_pure=True, pack=1)
        else:
            bits = (((word >> (8 * b)) & 0xFF) << 16) | 0x3F000000
        return bits.to(tl.float32, bitcast=True)


@triton.jit
def _funnel(lo, hi, s, ASM: tl.constexpr):
    """The 32 bits at bit s (0 or 16) of the 64-bit hi:lo: a word at a 2-byte aligned address."""
    if ASM:
        return tl.inline_asm_elementwise("shf.r.wrap.b32 $0, $1, $2, $3;", "=r,r,r,r", [lo, hi, s],
                                         dtype=tl.uint32, is_pure=True, pack=1)
    else:
        return (lo >> s) | ((hi << 16) << (16 - s))


@triton.jit
def _split4(t):
    """[..., 4] -> four [...] tensors in order (in-thread: no data moves)."""
    a, b = tl.split(tl.reshape(t, t.shape[:-1] + (2, 2)))  # a: 0, 2; b: 1, 3
    a0, a2 = tl.split(a)
    a1, a3 = tl.split(b)
    return a0, a1, a2, a3


@triton.jit
def _split8(t):
    """[..., 8] -> eight [...] tensors in order."""
    ev, od = tl.split(tl.reshape(t, t.shape[:-1] + (4, 2)))  # ev: 0, 2, 4, 6; od: 1, 3, 5, 7
    e0, e2, e4, e6 = _split4(ev)
    e1, e3, e5, e7 = _split4(od)
    return e0, e1, e2, e3, e4, e5, e6, e7


@triton.jit
def _words(at, n: tl.constexpr):
    """Words at .. at + n - 1 as a tuple of tensors."""
    ws = ()
    for i in tl.static_range(n):
        ws = ws + (tl.load(at + i),)
    return ws


@triton.jit
def _funnel4(at, s, ASM: tl.constexpr):
    """The 4 words from bit s (0 or 16) of word at on, as a tuple."""
    ws = _words(at, 5)
    return (_funnel(ws[0], ws[1], s, ASM), _funnel(ws[1], ws[2], s, ASM), _funnel(ws[2], ws[3], s, ASM),
            _funnel(ws[3], ws[4], s, ASM))


@triton.jit
def _words4(at):
    """Words at .. at + 3 (16-byte aligned) as a tuple, one vector load."""
    return _split4(tl.load(at[:, :, :, None] + tl.arange(0, 4)[None, None, None, :]))


@triton.jit
def _half_f32(word, HIGH: tl.constexpr):
    """The fp16 in the low (or high) half of a uint32 word, as float32."""
    h = (word >> 16) if HIGH else (word & 0xFFFF)
    return h.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _u8_f32(v):
    """float32 of the low byte of v (exact: 2**23 + byte assembled in the bits, minus 2**23)."""
    return ((v & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _i8_f32(v):
    """float32 of the low byte of v read as int8."""
    return (((v & 0xFF) ^ 0x80) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0


@triton.jit
def _k_scales(w1, w2, w3, g):
    """Q4_K/Q5_K: the 6-bit scales and mins of sub-blocks 2g and 2g + 1 from the 12 packed scale
    bytes (words w1, w2, w3), each pair decoded in 16-bit lanes: (sc0, sc1, m0, m1) as float32."""
    up = g >= 2
    sh = (g & 1) * 16
    sa = sh + tl.where(up, 2, 0)
    ma = tl.where(up, 0x3030, 0x3F3F)
    mc = tl.where(up, 0x0F0F, 0)
    sc = ((w1 >> sa) & ma) | ((w3 >> sh) & mc)
    mn = ((w2 >> sa) & ma) | ((w3 >> (sh + 4)) & mc)
    return _u8_f32(sc), _u8_f32(sc >> 8), _u8_f32(mn), _u8_f32(mn >> 8)


@triton.jit
def _ws_row(w_row, un, ok, QT: tl.constexpr, ASM: tl.constexpr):
    """One row's loads and scale work for units un: ((A, B) per stream, the raw words of the unit);
    lanes not ok get A = B = 0.

    Q4_K/Q5_K: unit = group g of sub-blocks 2g (low nibbles, stream 0) and 2g + 1 (high, stream 1);
    32 quant bytes at word 4 (Q4_K) or 12 (Q5_K), whose fifth bits (Q5_K) are bits 2g and 2g + 1 of
    the 32 qh bytes at word 4. Raw words: 8 quant words (Q5_K: then the 8 qh words >> 2g).
    Q6_K: a 210-byte block is word-aligned for even sb and 2 bytes off for odd sb (rows are whole
    words). Unit = (half h, l-half lh): bytes l = 16 lh + 0..15 of ql[64h..] (streams t = 0, 2),
    ql[64h + 32..] (t = 1, 3) and qh[32h..] (bits 2t, 2t + 1); weights 128h + 32t + l, scale
    8h + 2t + lh. Raw words: 4 each of the three.
    Q4_0/Q5_0/Q8_0: two blocks; the first's data is 2 bytes off, the second's aligned. Streams:
    (block, nibble) (Q4_0, Q5_0) or block (Q8_0). Raw words: the quant words of both blocks
    (Q5_0: then both qh).
    """
    sb = un >> 2
    u = un & 3
    if QT == 5:
        byte0 = sb * 210
        s = ((byte0 & 2) * 8).to(tl.uint32)
        h = u >> 1
        lh = u & 1
        at = w_row + (byte0 >> 2)  # the word holding the block's first byte
        d = tl.where(ok, _half_f32(tl.load(at + 52) >> s, False), 0.0)  # d at bytes 208..209
        sw = _words(at + 48 + 2 * h, 3)  # scale bytes 8h..8h + 7
        sa = _funnel(sw[0], sw[1], s, ASM)
        sc = _funnel(sw[1], sw[2], s, ASM)
        d0 = d * _i8_f32(sa >> (8 * lh))
        d1 = d * _i8_f32(sa >> (8 * lh + 16))
        d2 = d * _i8_f32(sc >> (8 * lh))
        d3 = d * _i8_f32(sc >> (8 * lh + 16))
        # v = 0.5 + q / 256 for the 6-bit q, w = D (q - 32): A = 256 D, B = 160 D
        coef = ((256.0 * d0, 160.0 * d0), (256.0 * d1, 160.0 * d1), (256.0 * d2, 160.0 * d2),
                (256.0 * d3, 160.0 * d3))
        la = at + 16 * h + 4 * lh
        words = _funnel4(la, s, ASM) + _funnel4(la + 8, s, ASM) + _funnel4(at + 32 + 8 * h + 4 * lh, s, ASM)
    elif QT == 3 or QT == 4:
        blk = w_row + sb * (36 if QT == 3 else 44)  # block words: 144 or 176 bytes
        w0, w1, w2, w3 = _words4(blk + u * 0)  # every lane of the block reads its header
        sc0, sc1, m0, m1 = _k_scales(w1, w2, w3, u)
        d = tl.where(ok, _half_f32(w0, False), 0.0)
        dmin = tl.where(ok, _half_f32(w0, True), 0.0)
        z = 32.0 if QT == 3 else 64.0  # v = 0.5 + q / z
        a0 = (d * sc0) * z
        a1 = (d * sc1) * z
        coef = ((a0, 0.5 * a0 + dmin * m0), (a1, 0.5 * a1 + dmin * m1))
        qs = blk + (4 if QT == 3 else 12) + u * 8
        words = _words4(qs) + _words4(qs + 4)
        if QT == 4:
            qh = _words4(blk + 4 + u * 0) + _words4(blk + 8 + u * 0)  # all 32 qh bytes
            for i in tl.static_range(8):
                words = words + (qh[i] >> (2 * u),)
    else:
        UW: tl.constexpr = 9 if QT == 0 else (11 if QT == 1 else 17)  # words per block pair
        ws = _words(w_row + un * UW, UW)
        d0 = tl.where(ok, _half_f32(ws[0], False), 0.0)
        d1 = tl.where(ok, _half_f32(ws[UW // 2], True), 0.0)
        if QT == 2:  # 32 int8 each: words 0..8 (2 bytes off), 9..16
            coef = ((d0, d0 * 0.0), (d1, d1 * 0.0))
            words = ()
            for i in tl.static_range(8):
                words = words + (_funnel(ws[i], ws[i + 1], 16, ASM) ^ 0x80808080,)
            for i in tl.static_range(8):
                words = words + (ws[9 + i] ^ 0x80808080,)
        elif QT == 0:  # 16 nibble bytes each: words 0..4 (2 bytes off), 5..8; w = d (n - 8)
            coef = ((32.0 * d0, 24.0 * d0), (32.0 * d0, 24.0 * d0), (32.0 * d1, 24.0 * d1), (32.0 * d1, 24.0 * d1))
            words = ()
            for i in tl.static_range(4):
                words = words + (_funnel(ws[i], ws[i + 1], 16, ASM),)
            words = words + (ws[5], ws[6], ws[7], ws[8])
        else:  # Q5_0: qh at word 0 (2 bytes off) and 6, nibbles at words 1..5 (2 bytes off), 7..10; w = d (q - 16)
            coef = ((64.0 * d0, 48.0 * d0), (64.0 * d0, 48.0 * d0), (64.0 * d1, 48.0 * d1), (64.0 * d1, 48.0 * d1))
            words = ()
            for i in tl.static_range(4):
                words = words + (_funnel(ws[1 + i], ws[2 + i], 16, ASM),)
            words = words + (ws[7], ws[8], ws[9], ws[10], _funnel(ws[0], ws[1], 16, ASM), ws[6])
    return coef, words


@triton.jit
def _ws_piece(words, t: tl.constexpr, p: tl.constexpr, QT: tl.constexpr):
    """The two prepared words of piece p of stream t."""
    return _ws_prep(words, t, 2 * p, QT), _ws_prep(words, t, 2 * p + 1, QT)


@triton.jit
def _ws_prep(words, t: tl.constexpr, i: tl.constexpr, QT: tl.constexpr):
    """Word i (piece i // 2, half i % 2) of stream t, prepared: its bytes are the values."""
    if QT == 3:  # nibble n as the byte n << 3 (v = 0.5 + n / 32)
        q = words[i]
        return ((q << 3) & 0x78787878) if t == 0 else ((q >> 1) & 0x78787878)
    elif QT == 4:  # 5-bit value q as the byte q << 2 (v = 0.5 + q / 64)
        q = words[i]
        qh = words[8 + i]
        if t == 0:
            return ((q << 2) & 0x3C3C3C3C) | ((qh << 6) & 0x40404040)
        else:
            return ((q >> 2) & 0x3C3C3C3C) | ((qh << 5) & 0x40404040)
    elif QT == 5:  # 6-bit value as the byte; ql words 0..3 (streams 0, 2), 4..7 (1, 3), qh words 8..11
        q = words[(t % 2) * 4 + i]
        qh = words[8 + i]
        q = (q & 0x0F0F0F0F) if t < 2 else ((q >> 4) & 0x0F0F0F0F)
        if t == 0:
            return q | ((qh << 4) & 0x30303030)
        elif t == 1:
            return q | ((qh << 2) & 0x30303030)
        elif t == 2:
            return q | (qh & 0x30303030)
        else:
            return q | ((qh >> 2) & 0x30303030)
    elif QT == 2:
        return words[8 * t + i]
    else:  # Q4_0: nibble n as n << 3; Q5_0: 5-bit q as q << 2, its bit 4 is qh bit 16 (t % 2) + 4i + b
        q = words[4 * (t // 2) + i]
        if QT == 0:
            return ((q << 3) & 0x78787878) if t % 2 == 0 else ((q >> 1) & 0x78787878)
        else:
            n = ((q << 2) & 0x3C3C3C3C) if t % 2 == 0 else ((q >> 2) & 0x3C3C3C3C)
            hb = (words[8 + t // 2] >> (16 * (t % 2) + 4 * i)) & 0xF
            return n | ((hb * 0x08102040) & 0x40404040)  # bit b of hb to bit 8b + 6


@triton.jit
def _ws_xcol(un, t: tl.constexpr, QT: tl.constexpr):
    """x columns [1, 8, 4, 8] of stream t's first piece (the next piece: + 8)."""
    if QT == 5:
        c = (un >> 2) * 256 + 128 * ((un & 3) >> 1) + 16 * (un & 1) + 32 * t
    elif QT == 0 or QT == 1:
        c = un * 64 + 16 * t
    else:
        c = un * 64 + 32 * t
    return c[:, :, :, None] + tl.arange(0, 8)[None, None, None, :]


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
