"""Q4_K and Q6_K quantization in numpy (gguf-py only dequantizes K-quants).

Block formats (ggml, super-blocks of QK_K = 256 values):
- Q4_K (144 bytes): fp16 d, fp16 dmin, 12 bytes of packed 6-bit scales and mins for 8
  sub-blocks of 32, 128 bytes of 4-bit quants; value = d * sc * q - dmin * m.
- Q6_K (210 bytes): 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 int8 scales for
  sub-blocks of 16, fp16 d; value = d * sc * (q - 32).

Each sub-block's scale (and min) is picked from a few candidates around the min-max fit,
each refined by least squares on its rounded quants, keeping the smallest squared error.
"""
from __future__ import annotations

import numpy as np

QK_K = 256
Q4_K_BYTES = 144
Q6_K_BYTES = 210
_CHUNK_VALUES = 1 << 20  # bounds the temporaries of the candidate search
# Q4_K: divisors of the value range around the 15 steps of a 4-bit quant.
_Q4_STEPS = np.linspace(13.5, 16.5, 7, dtype=np.float32)
_Q4_REFINE_ROUNDS = 2
# Q6_K: |max| maps to -t (the asymmetric end -32 is exact) or +t.
_Q6_NEG = np.linspace(26.0, 32.0, 7, dtype=np.float32)
_Q6_POS = np.linspace(28.0, 31.0, 3, dtype=np.float32)


def quantize_q4_k(x: np.ndarray, search: bool = True) -> np.ndarray:
    """float array [..., n * 256] -> Q4_K blocks, uint8 [..., n * 144]."""
    return _by_chunks(x, Q4_K_BYTES, lambda blocks: _q4_k_blocks(blocks, search))


def quantize_q6_k(x: np.ndarray, search: bool = True) -> np.ndarray:
    """float array [..., n * 256] -> Q6_K blocks, uint8 [..., n * 210]."""
    return _by_chunks(x, Q6_K_BYTES, lambda blocks: _q6_k_blocks(blocks, search))


def _by_chunks(x: np.ndarray, block_bytes: int, encode) -> np.ndarray:
    if x.ndim == 0 or x.shape[-1] % QK_K:
        raise ValueError(f"K-quants need rows that are a multiple of {QK_K}, got shape {x.shape}")
    blocks = np.asarray(x, dtype=np.float32).reshape(-1, QK_K)
    if not np.all(np.isfinite(blocks)):
        raise ValueError("cannot quantize a tensor holding NaN or infinity")
    out = np.empty((blocks.shape[0], block_bytes), dtype=np.uint8)
    step = max(1, _CHUNK_VALUES // QK_K)
    for start in range(0, blocks.shape[0], step):
        out[start:start + step] = encode(blocks[start:start + step])
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK_K * block_bytes)


# ---- Q4_K ------------------------------------------------------------------------------


def _q4_k_blocks(blocks: np.ndarray, search: bool) -> np.ndarray:
    sub = blocks.reshape(-1, 8, 32)
    scale, offset = _fit_affine(sub, search)  # sub ~ scale * q - offset, both >= 0
    d, sc = _to_6bit(scale)
    dmin, m = _to_6bit(offset)
    q = _quants(sub + (dmin[:, None] * m)[..., None], _inverse(d[:, None] * sc), 0, 15).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scales_mins(sc, m), _pack_nibbles(q)], axis=1)


def _fit_affine(sub: np.ndarray, search: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per sub-block (scale, offset) with sub ~ scale * q - offset, q in 0..15."""
    lo = np.minimum(sub.min(axis=-1), 0.0)  # the offset is stored as a non-negative min
    span = sub.max(axis=-1) - lo
    best_scale, best_offset = span / 15.0, -lo
    if not search:
        return best_scale, best_offset
    shifted = sub - lo[..., None]
    best_err = _affine_error(sub, _quants(shifted, _inverse(best_scale), 0, 15), best_scale, best_offset)
    for steps in _Q4_STEPS:
        q = _quants(shifted, _inverse(span / steps), 0, 15)
        scale, offset = _least_squares_affine(sub, q)
        # The error of the refit with these quants bounds the error after re-rounding.
        err = _affine_error(sub, q, scale, offset)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        best_offset = np.where(better, offset, best_offset)
    return _refine_affine(sub, best_scale, best_offset, best_err)


def _refine_affine(
    sub: np.ndarray, scale: np.ndarray, offset: np.ndarray, err: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Alternate re-rounding and least squares a few times, keeping only improvements."""
    for _ in range(_Q4_REFINE_ROUNDS):
        q = _quants(sub + offset[..., None], _inverse(scale), 0, 15)
        new_scale, new_offset = _least_squares_affine(sub, q)
        new_err = _affine_error(sub, q, new_scale, new_offset)
        better = new_err < err
        err = np.where(better, new_err, err)
        scale = np.where(better, new_scale, scale)
        offset = np.where(better, new_offset, offset)
    return scale, offset


def _least_squares_affine(sub: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Best (scale, offset) for fixed quants q, with offset >= 0 (the min is <= 0)."""
    n = np.float32(sub.shape[-1])
    sq, sx = q.sum(-1), sub.sum(-1)
    sqq, sqx = (q * q).sum(-1), (q * sub).sum(-1)
    det = n * sqq - sq * sq
    scale = _divide(n * sqx - sq * sx, det)
    offset = _divide(sq * sqx - sqq * sx, det)
    # Where the free fit wants a positive min, pin the offset to 0 and refit the scale alone.
    pinned = offset < 0
    scale = np.where(pinned, _divide(sqx, sqq), scale)
    offset = np.where(pinned, 0.0, offset)
    return np.maximum(scale, 0.0), offset


def _affine_error(sub: np.ndarray, q: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    diff = scale[..., None] * q - offset[..., None] - sub
    return (diff * diff).sum(-1)


def _to_6bit(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per block: fp16-exact super-scale and 6-bit multipliers of non-negative values."""
    top = values.max(axis=-1) / 63.0
    d = top.astype(np.float16).astype(np.float32)
    codes = np.clip(np.rint(_divide(values, d[:, None])), 0, 63)
    return d, codes.astype(np.uint8)


def _pack_scales_mins(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins -> 12 bytes: bytes 0-3 hold sc[0:4] plus the top 2 bits of
    sc[4:8], bytes 4-7 m[0:4] plus the top bits of m[4:8], bytes 8-11 their low nibbles."""
    lo_sc, hi_sc = sc[:, :4], sc[:, 4:]
    lo_m, hi_m = m[:, :4], m[:, 4:]
    first = lo_sc | ((hi_sc >> 4) << 6)
    second = lo_m | ((hi_m >> 4) << 6)
    third = (hi_sc & 0x0F) | ((hi_m & 0x0F) << 4)
    return np.concatenate([first, second, third], axis=1).astype(np.uint8)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """Quants [blocks, 8, 32] -> 128 bytes: sub-blocks 2k and 2k+1 share bytes 32k..32k+31
    (low and high nibble)."""
    pairs = q.reshape(-1, 4, 2, 32)
    return (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)


# ---- Q6_K ------------------------------------------------------------------------------


def _q6_k_blocks(blocks: np.ndarray, search: bool) -> np.ndarray:
    sub = blocks.reshape(-1, 16, 16)
    scale = _fit_symmetric(sub, search)
    top = np.abs(scale).max(axis=-1) / 127.0
    d = top.astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(_divide(scale, d[:, None])), -128, 127)
    q = _quants(sub, _inverse(d[:, None] * sc), -32, 31).astype(np.int16) + 32
    ql, qh = _pack_six_bits(q.reshape(-1, QK_K).astype(np.uint8))
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=1)


def _fit_symmetric(sub: np.ndarray, search: bool) -> np.ndarray:
    """Per sub-block scale s with sub ~ s * q, q in -32..31 (s may be negative)."""
    idx = np.abs(sub).argmax(axis=-1)[..., None]
    peak = np.take_along_axis(sub, idx, axis=-1)[..., 0]
    best = peak / 31.0
    if not search:
        return best
    q = _quants(sub, _inverse(best), -32, 31)
    best_err = _symmetric_error(sub, q, best)
    candidates = [-peak / t for t in _Q6_NEG] + [peak / t for t in _Q6_POS]
    for scale in candidates:
        q = _quants(sub, _inverse(scale), -32, 31)
        refit = _divide((q * sub).sum(-1), (q * q).sum(-1))
        err = _symmetric_error(sub, q, refit)  # bounds the error after re-rounding
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best = np.where(better, refit, best)
    return best


def _symmetric_error(sub: np.ndarray, q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    diff = scale[..., None] * q - sub
    return (diff * diff).sum(-1)


def _pack_six_bits(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quants 0..63 [blocks, 256] -> (ql 128 bytes, qh 64 bytes). Each half of 128 values
    is four runs of 32: runs 0/1 fill the low nibbles of ql[0:32]/ql[32:64], runs 2/3 the
    high nibbles, and run k's top two bits sit at bits 2k of qh[0:32]."""
    runs = q.reshape(-1, 2, 4, 32)
    low, high = runs & 0x0F, runs >> 4
    ql = np.stack([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return ql.reshape(-1, 128), qh.reshape(-1, 64)


# ---- shared ----------------------------------------------------------------------------


def _quants(values: np.ndarray, inverse_scale: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Nearest quant of each value for per-sub-block scales (given as 1/scale)."""
    return np.clip(np.rint(values * inverse_scale[..., None]), lo, hi)


def _inverse(scale: np.ndarray) -> np.ndarray:
    return _divide(np.ones_like(scale), scale)


def _divide(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, with 0 where den is 0 (an all-zero sub-block)."""
    safe = np.where(den == 0, 1.0, den)
    return np.where(den == 0, 0.0, num / safe).astype(np.float32)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype("<f2").view(np.uint8).reshape(-1, 2)
