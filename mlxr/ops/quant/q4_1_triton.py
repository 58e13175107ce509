"""Q4_1's GEMV tiles for extra_triton's `_gemv_kernel`, read from the raw 20-byte blocks
(fp16 d and m, then 16 quant bytes: byte j holds weight j in its low nibble and weight j + 16 in
its high one) as 32-bit words: each word is loaded once and its 8 weights dequantized in its
thread. `_q4_1_tile` keeps a word's 8 weights together; `_q4_1_halves` (the default) splits
them into low and high nibbles so each half's columns are contiguous and x is read in vector
loads. Either way a row's arithmetic does not depend on the other rows."""
from __future__ import annotations

import triton
import triton.language as tl

from mlxr.ops.quant.blocks_triton import _half


@triton.jit
def _q4_1_words(v_ptr, rb, blk0, NB: tl.constexpr):
    """NB blocks from block blk0 of the weight rows at byte offsets rb [BN, 1]: their indices b
    [1, NB], scales d and mins m [BN, NB, 1], word numbers q [1, 1, 4] and quant words qw
    [BN, NB, 4] (word q: bytes 4q..4q+3, low nibbles columns 4q+i, high ones 16+4q+i)."""
    b = blk0 + tl.arange(0, NB)[None, :]
    word0 = (rb + b * 20) // 4  # [BN, NB]: the block's d|m word
    dm = tl.load(v_ptr + word0)
    q = tl.arange(0, 4)[None, None, :]
    return b, _half(dm)[:, :, None], _half(dm >> 16)[:, :, None], q, tl.load(v_ptr + word0[:, :, None] + 1 + q)


@triton.jit
def _q4_1_value(d, m, qw, SHIFT: tl.constexpr):
    return d * ((qw >> SHIFT) & 15).to(tl.float32) + m


@triton.jit
def _q4_1_tile(v_ptr, rb, blk0, NB: tl.constexpr):
    """Q4_1's GEMV tile: the weights of NB blocks from block blk0 as [BN, NB, 4, 8] (block, quant
    word, its 8 nibbles) and their columns [1, NB, 4, 8]. Each 32-bit quant word is loaded once
    and its 8 weights dequantized in its thread (tl.join keeps a joined dimension in-thread),
    where the gathers of _weights load a byte a weight and a block's scales once a weight."""
    b, d, m, q, qw = _q4_1_words(v_ptr, rb, blk0, NB)
    lo = tl.join(tl.join(_q4_1_value(d, m, qw, 0), _q4_1_value(d, m, qw, 8)),
                 tl.join(_q4_1_value(d, m, qw, 16), _q4_1_value(d, m, qw, 24)))
    hi = tl.join(tl.join(_q4_1_value(d, m, qw, 4), _q4_1_value(d, m, qw, 12)),
                 tl.join(_q4_1_value(d, m, qw, 20), _q4_1_value(d, m, qw, 28)))
    # [.., j, k, h]: byte j + 2k of word q, nibble h; flattened e = 4j + 2k + h
    w = tl.reshape(tl.join(lo, hi), [rb.shape[0], NB, 4, 8])
    e = tl.arange(0, 8)[None, None, None, :]
    cols = b[:, :, None, None] * 32 + 16 * (e % 2) + 4 * q[:, :, :, None] + e // 4 + 2 * ((e // 2) % 2)
    return w, cols


@triton.jit
def _q4_1_halves(v_ptr, rb, blk0, NB: tl.constexpr):
    """Q4_1's GEMV tile as two halves [BN, NB, 4, 4] (block, quant word q, its byte i): the low
    nibbles, columns 32b + 4q + i, and the high ones, those + 16; and the low half's columns
    [1, NB, 4, 4]. Each half's columns run contiguously in the last two dimensions, so a row of
    x is read for it in 16-byte loads rather than one float at a time (_q4_1_tile's order)."""
    b, d, m, q, qw = _q4_1_words(v_ptr, rb, blk0, NB)
    # join(join(byte 0, byte 2), join(byte 1, byte 3)) flattens to bytes 0, 1, 2, 3
    lo = tl.join(tl.join(_q4_1_value(d, m, qw, 0), _q4_1_value(d, m, qw, 16)),
                 tl.join(_q4_1_value(d, m, qw, 8), _q4_1_value(d, m, qw, 24)))
    hi = tl.join(tl.join(_q4_1_value(d, m, qw, 4), _q4_1_value(d, m, qw, 20)),
                 tl.join(_q4_1_value(d, m, qw, 12), _q4_1_value(d, m, qw, 28)))
    cols = b[:, :, None, None] * 32 + 4 * q[:, :, :, None] + tl.arange(0, 4)[None, None, None, :]
    return tl.reshape(lo, [rb.shape[0], NB, 4, 4]), tl.reshape(hi, [rb.shape[0], NB, 4, 4]), cols


@triton.jit
def _accumulate_halves(accs, lo, hi, x_ptrs, stride_x, MB: tl.constexpr):
    """Row r's two accumulators (accs[2r], accs[2r + 1]) += the halves times row r's x."""
    out = ()
    for r in tl.static_range(MB):
        xr = x_ptrs + r * stride_x
        out = out + (accs[2 * r] + lo * tl.load(xr).to(tl.float32),
                     accs[2 * r + 1] + hi * tl.load(xr + 16).to(tl.float32))
    return out
