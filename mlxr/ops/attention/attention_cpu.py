"""Launchers for the CPU attention kernels (mlxr/ops/attention/attention.c): float32 queries and
rope; the paged kernels read caches of any format of kv_quant.py.

Called once per layer per step, so they check tensor attributes rather than run torch ops,
and return None where the kernel does not apply (the caller then runs the torch reference)."""
from __future__ import annotations

import ctypes

import torch

from mlxr.ops.cpu.cpu_build import load_library

_I64, _PTR, _F32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
MAX_HEAD_DIM = 1024  # the kernel's angle tables


def _library() -> ctypes.CDLL | None:
    lib = load_library("attention")
    if lib is not None and not getattr(lib, "_typed", False):
        lib.mlxr_rope_write_kv_f32.argtypes = [_PTR, _I64, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64, _I64,
                                               _I64, _I64, _PTR, _PTR, _PTR, ctypes.c_int, _I64, _PTR]
        lib.mlxr_paged_decode_f32.argtypes = [_PTR, _PTR, _PTR, ctypes.c_int, _I64, _PTR, _I64, _PTR, _I64, _I64,
                                              _I64, _I64, _I64, _F32, _I64, _F32, _PTR, _PTR, ctypes.c_int]
        lib.mlxr_paged_decode_f32.restype = ctypes.c_int
        lib.mlxr_paged_prefill_f32.argtypes = [_PTR, _PTR, _PTR, ctypes.c_int, _I64, _PTR, _I64, _PTR, _PTR, _I64,
                                               _I64, _I64, _I64, _I64, _F32, _I64, _F32, _PTR, _PTR, ctypes.c_int]
        lib.mlxr_paged_prefill_f32.restype = ctypes.c_int
        lib._typed = True
    return lib


def _f32_cpu(*tensors: torch.Tensor) -> bool:
    for t in tensors:  # a loop, not all() over a generator: these run several times a layer
        if t.dtype != torch.float32 or not t.is_cpu:
            return False
    return True


def _heads_dense(x: torch.Tensor) -> bool:
    """[T, heads, d] with each token's heads back to back (rows may be apart: split views)."""
    if x.dim() != 3:
        return False
    _, s1, s2 = x.stride()
    return s2 == 1 and s1 == x.shape[2]


def _int64_cpu(x: torch.Tensor) -> bool:
    return x.dtype == torch.int64 and x.is_cpu and x.is_contiguous()


def rope_write_kv_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor | None,
    inv_freq: torch.Tensor | None, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
) -> torch.Tensor | None:
    """Rotated q (a new tensor; q itself without inv_freq) after rotated k and v were stored
    at their slots; None when the kernel does not apply."""
    rotating = inv_freq is not None
    if not (_f32_cpu(q, k, v) and k_cache.is_cpu and k_cache.dtype == v_cache.dtype and _heads_dense(q)
            and _heads_dense(k) and _heads_dense(v) and k_cache.is_contiguous() and v_cache.is_contiguous()
            and _int64_cpu(slots) and q.shape[2] <= MAX_HEAD_DIM and torch.is_inference_mode_enabled()):
        return None
    fmt = _cache_format(k_cache, q.shape[2])
    if fmt is None:
        return None
    if rotating and not (_int64_cpu(positions) and inv_freq.dtype == torch.float32 and inv_freq.is_contiguous()):
        return None
    lib = _library()
    if lib is None:
        return None
    t, h, d = q.shape
    q_out = torch.empty(t, h, d) if rotating else q
    lib.mlxr_rope_write_kv_f32(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                               positions.data_ptr() if rotating else None,
                               inv_freq.data_ptr() if rotating else None, t, h, k.shape[1], d,
                               q_out.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), fmt,
                               k_cache.shape[-1] * k_cache.element_size(), slots.data_ptr())
    return q_out


# attention_rows.h's format codes by cache dtype (uint8: q4_0 or fp8, told apart by the row's width).
_FORMATS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.int8: 3}
_Q4_0, _FP8 = 4, 5


def _cache_format(k_cache: torch.Tensor, head_dim: int) -> int | None:
    """The kernel's code for the cache's format, None where it reads no such cache."""
    if k_cache.dtype == torch.uint8:
        return _Q4_0 if k_cache.shape[-1] * 32 == head_dim * 18 else _FP8
    return _FORMATS.get(k_cache.dtype)


def _sinks_fit(sinks: torch.Tensor | None, heads: int) -> bool:
    return sinks is None or (_f32_cpu(sinks) and sinks.is_contiguous() and tuple(sinks.shape) == (heads,))


def _pointer(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


def _paged_library(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   *index: torch.Tensor) -> ctypes.CDLL | None:
    """The library when a paged kernel applies to these tensors (fp32 queries, CPU caches of
    one format, all contiguous, int64 index tensors, under inference mode), else None."""
    if not (_f32_cpu(q) and k_cache.is_cpu and k_cache.dtype == v_cache.dtype and q.is_contiguous()
            and k_cache.is_contiguous() and v_cache.is_contiguous() and torch.is_inference_mode_enabled()):
        return None
    for t in index:
        if not _int64_cpu(t):
            return None
    return _library()


def paged_decode_cpu(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, sliding_window: int | None, softcap: float | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """One new token per sequence (q [S, H, D]) over its paged context; None when the kernel
    does not apply. sinks: [H] float32, one logit per head counted in every softmax."""
    lib = _paged_library(q, k_cache, v_cache, block_tables, seq_lens)
    if lib is None or not _sinks_fit(sinks, q.shape[1]):
        return None
    n, h, d = q.shape
    _, bs, kh, width = k_cache.shape
    fmt = _cache_format(k_cache, d)
    if fmt is None:
        return None
    out = torch.empty(n, h, d)
    status = lib.mlxr_paged_decode_f32(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), fmt,
                                       width * k_cache.element_size(), block_tables.data_ptr(),
                                       block_tables.shape[1], seq_lens.data_ptr(), n, h, kh, d, bs, scale,
                                       sliding_window or 0, softcap or 0.0, _pointer(sinks), out.data_ptr(),
                                       torch.get_num_threads())
    if status != 0:
        raise MemoryError("paged decode attention: no scratch memory")
    return out


def paged_prefill_cpu(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, sliding_window: int | None,
    softcap: float | None, sinks: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Each sequence's new tokens (q [T, H, D], sequence s's at query_start_loc[s]:[s+1]) over
    its paged context, causally; None when the kernel does not apply. The decode kernel's
    arithmetic, a token at a time."""
    lib = _paged_library(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    if lib is None or not _sinks_fit(sinks, q.shape[1]):
        return None
    t, h, d = q.shape
    _, bs, kh, width = k_cache.shape
    fmt = _cache_format(k_cache, d)
    if fmt is None:
        return None
    out = torch.empty(t, h, d)
    status = lib.mlxr_paged_prefill_f32(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), fmt,
                                        width * k_cache.element_size(), block_tables.data_ptr(), block_tables.shape[1], query_start_loc.data_ptr(),
                                        seq_lens.data_ptr(), seq_lens.shape[0], h, kh, d, bs, scale,
                                        sliding_window or 0, softcap or 0.0, _pointer(sinks), out.data_ptr(),
                                        torch.get_num_threads())
    if status != 0:
        raise MemoryError("paged prefill attention: no scratch memory")
    return out
