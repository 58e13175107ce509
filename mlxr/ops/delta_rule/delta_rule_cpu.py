"""Launchers for the CPU delta-rule and causal-convolution kernels (mlxr/ops/delta_rule/delta_rule.c):
float32 only. Each returns None where its kernel does not apply (the dispatcher then runs the
torch reference); they check tensor attributes only, since they run for every layer of a step."""
from __future__ import annotations

import ctypes

import torch

from mlxr.ops.cpu.cpu_build import load_library

_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
MAX_HEAD_DIM = 512  # the kernel's per-token scratch (delta_rule.c MAX_DIM)
MAX_CONV_WIDTH = 17  # its convolution keeps at most 16 earlier inputs (MAX_KEEP)


def _library() -> ctypes.CDLL | None:
    lib = load_library("delta_rule")
    if lib is not None and not getattr(lib, "_typed", False):
        qkv = [_PTR, _I64, _PTR, _I64, _PTR, _I64]
        lib.mlxr_delta_step_f32.argtypes = [*qkv, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64,
                                            _INT]
        lib.mlxr_delta_step_f32.restype = None
        lib.mlxr_delta_chunked_f32.argtypes = [*qkv, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _INT]
        lib.mlxr_delta_chunked_f32.restype = _INT
        lib.mlxr_causal_conv_f32.argtypes = [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT]
        lib.mlxr_causal_conv_f32.restype = None
        lib.mlxr_causal_conv_step_f32.argtypes = [_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT]
        lib.mlxr_causal_conv_step_f32.restype = None
        lib._typed = True
    return lib


def _f32_cpu(*tensors: torch.Tensor) -> bool:
    for t in tensors:
        if t.dtype != torch.float32 or not t.is_cpu:
            return False
    return True


def _rows_of_heads(x: torch.Tensor) -> bool:
    """[T, heads, d] with each token's heads back to back (tokens may be apart: split views)."""
    return x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


def _heads_fit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> bool:
    if not (_f32_cpu(q, k, v, g, beta) and _rows_of_heads(q) and _rows_of_heads(k) and _rows_of_heads(v)):
        return False
    hk, hv = k.shape[1], v.shape[1]
    return (q.shape == k.shape and hv % hk == 0 and max(k.shape[2], v.shape[2]) <= MAX_HEAD_DIM
            and g.is_contiguous() and beta.is_contiguous() and g.shape == beta.shape == v.shape[:2])


def _rows_index(b: int, *index: torch.Tensor | None) -> bool:
    """int64 [b] contiguous CPU tensors (None passes: an optional one)."""
    for t in index:
        if t is not None and not (t.dtype == torch.int64 and t.is_cpu and t.is_contiguous() and t.shape == (b,)):
            return False
    return True


def _pointer(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


def delta_step_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   pool: torch.Tensor, slots: torch.Tensor, seq_lens: torch.Tensor | None = None) -> torch.Tensor | None:
    """o [B, Hv, Dv] of one token a row, pool[slots[b]] advanced in place (from zeros where seq_lens
    is 1: a row's first token); None when it does not apply."""
    b, hv, dv = v.shape
    if not (_heads_fit(q, k, v, g, beta) and _f32_cpu(pool) and pool.is_contiguous()
            and tuple(pool.shape[1:]) == (hv, k.shape[2], dv) and _rows_index(b, slots, seq_lens)):
        return None
    lib = _library()
    if lib is None:
        return None
    out = torch.empty(b, hv, dv)
    lib.mlxr_delta_step_f32(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                            g.data_ptr(), beta.data_ptr(), pool.data_ptr(), slots.data_ptr(), _pointer(seq_lens),
                            out.data_ptr(), b, k.shape[1], hv, k.shape[2], dv, torch.get_num_threads())
    return out


def delta_chunked_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      state: torch.Tensor) -> torch.Tensor | None:
    """o [T, Hv, Dv] of one sequence, state [Hv, Dk, Dv] advanced in place; None when it does not apply."""
    t, hv, dv = v.shape
    if not (_heads_fit(q, k, v, g, beta) and _f32_cpu(state) and state.is_contiguous()
            and tuple(state.shape) == (hv, k.shape[2], dv)):
        return None
    lib = _library()
    if lib is None:
        return None
    out = torch.empty(t, hv, dv)
    if t == 0:
        return out
    failed = lib.mlxr_delta_chunked_f32(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(),
                                        v.stride(0), g.data_ptr(), beta.data_ptr(), state.data_ptr(), out.data_ptr(),
                                        t, k.shape[1], hv, k.shape[2], dv, torch.get_num_threads())
    if failed:
        raise MemoryError("the delta rule's chunk scratch could not be allocated")
    return out


def _conv_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (_f32_cpu(x, weight) and x.dim() == 2 and x.stride(1) == 1 and weight.is_contiguous()
            and weight.shape[0] == x.shape[1] and 2 <= weight.shape[1] <= MAX_CONV_WIDTH)


def causal_conv_cpu(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """SiLU(conv(x)) [T, C] of one sequence, state [C, K - 1] replaced in place; None when it does not apply."""
    t, c = x.shape
    if not (_conv_fits(x, weight) and _f32_cpu(state) and state.is_contiguous()
            and tuple(state.shape) == (c, weight.shape[1] - 1)):
        return None
    lib = _library()
    if lib is None:
        return None
    out = torch.empty(t, c)
    lib.mlxr_causal_conv_f32(x.data_ptr(), x.stride(0), state.data_ptr(), weight.data_ptr(), out.data_ptr(),
                             t, c, weight.shape[1], torch.get_num_threads())
    return out


def causal_conv_step_cpu(x: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor, weight: torch.Tensor,
                         seq_lens: torch.Tensor | None = None) -> torch.Tensor | None:
    """SiLU(conv) [B, C] of one token a row, pool[slots[b]] shifted in place (zeros before a row whose
    seq_lens is 1); None when it does not apply."""
    b, c = x.shape
    if not (_conv_fits(x, weight) and _f32_cpu(pool) and pool.is_contiguous()
            and tuple(pool.shape[1:]) == (c, weight.shape[1] - 1) and _rows_index(b, slots, seq_lens)):
        return None
    lib = _library()
    if lib is None:
        return None
    out = torch.empty(b, c)
    lib.mlxr_causal_conv_step_f32(x.data_ptr(), x.stride(0), pool.data_ptr(), slots.data_ptr(), _pointer(seq_lens),
                                  weight.data_ptr(), out.data_ptr(), b, c, weight.shape[1], torch.get_num_threads())
    return out
