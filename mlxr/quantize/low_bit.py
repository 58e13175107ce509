"""Q5_K, Q3_K, Q2_K and IQ4_NL quantization in numpy (gguf-py only dequantizes them), for the
q5_k_m, q3_k_m and q2_k file types and llama.cpp's IQ4_NL fallback for short rows.

Block formats (ggml; gguf-py's dequantizers are the reference the tests check against):
- Q5_K (176 bytes / 256): Q4_K's d, dmin and 6-bit scales/mins, then 32 bytes of fifth bits
  (bit s of byte j: sub-block s, element j), then Q4_K's nibbles; value = d*sc*q - dmin*m.
- Q2_K (84 / 256): 16 bytes of 4-bit scale | 4-bit min per 16 values, 64 bytes of 2-bit
  quants, fp16 d and dmin; value = d*sc*q - dmin*m, q in 0..3.
- Q3_K (110 / 256): 32 bytes of high bits, 64 bytes of low 2-bit pairs, 12 bytes of 6-bit
  signed scales per 16 values, fp16 d; value = d*(sc-32)*q, q in -4..3 (high bit set: no -4).
- IQ4_NL (18 / 32): fp16 d and 4-bit indices into a fixed non-linear grid; value = d*grid[q].
Each fit tries a few scales around the min-max one and refits by least squares.
"""
from __future__ import annotations

import numpy as np

from mlxr.ops.quant.reference_extra import IQ4_KVALUES
from mlxr.quantize.kquants import (QK_K, _affine_error, _by_chunks, _divide, _f16_bytes, _inverse,
                                   _least_squares_affine, _pack_nibbles, _pack_scales_mins, _quants,
                                   _to_6bit)

_GRID = np.array(IQ4_KVALUES, dtype=np.float32)
_STEP_FACTORS = np.linspace(0.9, 1.1, 5, dtype=np.float32)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    return _by_chunks(x, 176, _q5_k_blocks)


def quantize_q2_k(x: np.ndarray) -> np.ndarray:
    return _by_chunks(x, 84, _q2_k_blocks)


def quantize_q3_k(x: np.ndarray) -> np.ndarray:
    return _by_chunks(x, 110, _q3_k_blocks)


def quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    """float array [..., n * 32] -> IQ4_NL blocks [..., n * 18]."""
    if x.ndim == 0 or x.shape[-1] % 32:
        raise ValueError(f"IQ4_NL needs rows that are a multiple of 32, got shape {x.shape}")
    blocks = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    d, idx = _fit_grid(blocks)
    qs = (idx[:, :16] | (idx[:, 16:] << 4)).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), qs], axis=1).reshape(*x.shape[:-1], x.shape[-1] // 32 * 18)


def _fit_affine(sub: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Per sub-block (scale, offset >= 0) with sub ~ scale * q - offset, q in 0..top."""
    lo = np.minimum(sub.min(axis=-1), 0.0)
    span = sub.max(axis=-1) - lo
    best_scale, best_offset = span / top, -lo
    shifted = sub - lo[..., None]
    best_err = _affine_error(sub, _quants(shifted, _inverse(best_scale), 0, top), best_scale, best_offset)
    for f in _STEP_FACTORS:
        q = _quants(shifted, _inverse(span / (top * f)), 0, top)
        scale, offset = _least_squares_affine(sub, q)
        err = _affine_error(sub, q, scale, offset)
        better = err < best_err
        best_err, best_scale = np.where(better, err, best_err), np.where(better, scale, best_scale)
        best_offset = np.where(better, offset, best_offset)
    return best_scale, best_offset


def _q5_k_blocks(blocks: np.ndarray) -> np.ndarray:
    sub = blocks.reshape(-1, 8, 32)
    scale, offset = _fit_affine(sub, 31)
    d, sc = _to_6bit(scale)
    dmin, m = _to_6bit(offset)
    q = _quants(sub + (dmin[:, None] * m)[..., None], _inverse(d[:, None] * sc), 0, 31).astype(np.uint8)
    qh = ((q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)  # (n, 32)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scales_mins(sc, m), qh,
                           _pack_nibbles(q & 0x0F)], axis=1)


def _to_4bit(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = (values.max(axis=-1) / 15.0).astype(np.float16).astype(np.float32)
    return d, np.clip(np.rint(_divide(values, d[:, None])), 0, 15).astype(np.uint8)


def _pack_two_bits(q: np.ndarray) -> np.ndarray:
    """Codes 0..3 [blocks, 256] -> 64 bytes: per half of 128, element 32t + l at shift 2t of byte l."""
    runs = q.reshape(-1, 2, 4, 32).astype(np.uint8)
    packed = runs[:, :, 0] | (runs[:, :, 1] << 2) | (runs[:, :, 2] << 4) | (runs[:, :, 3] << 6)
    return packed.reshape(-1, 64)


def _q2_k_blocks(blocks: np.ndarray) -> np.ndarray:
    sub = blocks.reshape(-1, 16, 16)
    scale, offset = _fit_affine(sub, 3)
    d, sc = _to_4bit(scale)
    dmin, m = _to_4bit(offset)
    q = _quants(sub + (dmin[:, None] * m)[..., None], _inverse(d[:, None] * sc), 0, 3)
    return np.concatenate([sc | (m << 4), _pack_two_bits(q.reshape(-1, QK_K)), _f16_bytes(d), _f16_bytes(dmin)],
                          axis=1)


def _fit_symmetric(sub: np.ndarray) -> np.ndarray:
    """Per sub-block scale s with sub ~ s * q, q in -4..3 (s may be negative)."""
    peak = np.take_along_axis(sub, np.abs(sub).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    best = -peak / 4.0
    best_err = _sym_error(sub, best)
    for base in (-peak / 4.0, peak / 3.0):
        for f in _STEP_FACTORS:
            q = _quants(sub, _inverse(base * f), -4, 3)
            refit = _divide((q * sub).sum(-1), (q * q).sum(-1))
            err = _sym_error(sub, refit)
            better = err < best_err
            best_err, best = np.where(better, err, best_err), np.where(better, refit, best)
    return best


def _sym_error(sub: np.ndarray, scale: np.ndarray) -> np.ndarray:
    diff = scale[..., None] * _quants(sub, _inverse(scale), -4, 3) - sub
    return (diff * diff).sum(-1)


def _q3_k_blocks(blocks: np.ndarray) -> np.ndarray:
    sub = blocks.reshape(-1, 16, 16)
    scale = _fit_symmetric(sub)
    peak = np.take_along_axis(scale, np.abs(scale).argmax(axis=-1)[:, None], axis=-1)[:, 0]
    d = (-peak / 32.0).astype(np.float16).astype(np.float32)  # the largest scale maps to -32
    ls = np.clip(np.rint(_divide(scale, d[:, None])), -32, 31)
    q = _quants(sub, _inverse(d[:, None] * ls), -4, 3).reshape(-1, QK_K).astype(np.int16) + 4
    high = (q >> 2).astype(np.uint8).reshape(-1, 8, 32)  # element 32b + l: bit b of hmask[l]
    hmask = (high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    return np.concatenate([hmask, _pack_two_bits(q & 3), _pack_q3_scales((ls + 32).astype(np.uint8)), _f16_bytes(d)],
                          axis=1)


def _pack_q3_scales(sc: np.ndarray) -> np.ndarray:
    """16 six-bit scales -> 12 bytes: byte s < 8 holds the low nibbles of s and s + 8; byte
    8 + r holds the top two bits of scale 4t + r at shift 2t."""
    low = (sc[:, :8] & 0x0F) | ((sc[:, 8:] & 0x0F) << 4)
    top = (sc >> 4).reshape(-1, 4, 4)  # [t, r]
    high = top[:, 0] | (top[:, 1] << 2) | (top[:, 2] << 4) | (top[:, 3] << 6)
    return np.concatenate([low, high], axis=1).astype(np.uint8)


def _fit_grid(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    peak = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=-1)[:, None], axis=-1)[:, 0]
    best_d, best_err = None, None
    for f in _STEP_FACTORS:
        d = (peak / (_GRID[0] * f)).astype(np.float16).astype(np.float32)
        idx = _nearest(blocks, d)
        k = _GRID[idx]
        d = _divide((k * blocks).sum(-1), (k * k).sum(-1)).astype(np.float16).astype(np.float32)
        err = ((d[:, None] * _GRID[_nearest(blocks, d)] - blocks) ** 2).sum(-1)
        if best_d is None:
            best_d, best_err = d, err
        else:
            better = err < best_err
            best_d, best_err = np.where(better, d, best_d), np.where(better, err, best_err)
    return best_d, _nearest(blocks, best_d).astype(np.uint8)


def _nearest(blocks: np.ndarray, d: np.ndarray) -> np.ndarray:
    return np.abs(blocks[..., None] - d[:, None, None] * _GRID).argmin(axis=-1)
