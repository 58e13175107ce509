"""Launcher for the CPU RMSNorm kernel (mlxr/ops/cpu/norm.c): float32 rows only."""
from __future__ import annotations

import ctypes

import torch

from mlxr.ops.cpu.build import load_library


def _library() -> ctypes.CDLL | None:
    lib = load_library("norm")
    if lib is not None and not getattr(lib, "_typed", False):
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.mlxr_rms_norm_f32.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, ctypes.c_float, ctypes.c_int]
        lib._typed = True
    return lib


def fits(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> bool:
    f32 = torch.float32
    return (x.dtype == f32 and weight.dtype == f32 and weight.is_cpu and weight.dim() == 1
            and (residual is None or (residual.dtype == f32 and residual.is_cpu and residual.shape == x.shape)))


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, x.shape[-1]).contiguous()


def rms_norm_cpu(
    x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(norm(x [+ residual]), x + residual or None), or None when the kernel is unavailable.
    The caller checks `fits` (attribute checks only: ~100 norms a decode step)."""
    lib = _library()
    if lib is None:
        return None
    rows = _rows(x)
    res = None if residual is None else _rows(residual)
    w = weight if weight.is_contiguous() else weight.contiguous()
    out = torch.empty_like(rows)
    new_res = None if res is None else torch.empty_like(rows)
    lib.mlxr_rms_norm_f32(rows.data_ptr(), None if res is None else res.data_ptr(), w.data_ptr(), out.data_ptr(),
                          None if new_res is None else new_res.data_ptr(), rows.shape[0], rows.shape[1],
                          eps, int(gemma))
    if rows is x:
        return out, new_res
    return out.view(x.shape), None if new_res is None else new_res.view(x.shape)
