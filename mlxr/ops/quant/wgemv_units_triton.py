"""Per-type unit decoding of the word-stream GEMV (wgemv_triton.py): a lane's loads and
scale work for its unit of 64 weights (_ws_row), its words prepared so that each byte is a value
(_ws_prep), and the x columns each stream multiplies (_ws_xcol). The unit layout of each GGUF type
is described at _ws_row."""
from __future__ import annotations

import triton
import triton.language as tl

from mlxr.ops.quant.wgemv_words_triton import _funnel, _funnel4, _half_f32, _i8_f32, _u8_f32, _words, _words4


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
