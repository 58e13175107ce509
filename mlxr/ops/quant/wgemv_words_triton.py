"""Word-level helpers of the word-stream GEMV (wgemv_triton.py): a prepared byte as
float32 (one PRMT on the GPU), 32-bit words at 2-byte aligned addresses (one funnel shift), tuples
of words and in-thread splits, and the fp16/uint8/int8 fields of a word as float32."""
from __future__ import annotations

import triton
import triton.language as tl


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
