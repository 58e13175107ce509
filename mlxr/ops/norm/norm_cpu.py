"""Launcher for the CPU RMSNorm kernel (mlxr/ops/norm/norm.c): float32 rows only."""
from __future__ import annotations

import ctypes

import torch

from mlxr.ops.cpu.cpu_build import load_library


def _library() -> ctypes.CDLL | None:
    lib = load_library("norm")
    if lib is not None and not getattr(lib, "_typed", False):
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.mlxr_rms_norm_f32.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, ctypes.c_float, ctypes.c_int,
                                          ctypes.c_int]
        lib._typed = True
    return lib


def fits(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> bool:
    f32 = torch.float32
    return (x.dtype == f32 and weight.dtype == f32 and weight.is_cpu and weight.dim() == 1
            and (residual is None or (residual.dtype == f32 and residual.is_cpu and residual.shape == x.shape)))


def rms_norm_cpu(
    x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(norm(x [+ residual]), x + residual or None), or None when the kernel is unavailable.
    The caller checks `fits` (attribute checks only: ~100 norms a decode step)."""
    lib = _library()
    if lib is None:
        return None
    # Contiguous rows of any rank go in as they are: a reshape or view costs ~0.7 us.
    x = x if x.is_contiguous() else x.contiguous()
    res = None if residual is None else residual if residual.is_contiguous() else residual.contiguous()
    w = weight if weight.is_contiguous() else weight.contiguous()
    dim = x.shape[-1]
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    new_res = None if res is None else torch.empty_like(out)
    lib.mlxr_rms_norm_f32(x.data_ptr(), None if res is None else res.data_ptr(), w.data_ptr(), out.data_ptr(),
                          None if new_res is None else new_res.data_ptr(), x.numel() // dim if dim else 0, dim,
                          eps, int(gemma), torch.get_num_threads())
    return out, new_res
