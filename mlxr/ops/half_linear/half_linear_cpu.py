"""Launcher for the CPU kernel of float16 weights against a few float32 rows
(mlxr/ops/half_linear/half_linear.c): one read of the weights for all the rows of a decode step."""
from __future__ import annotations

import ctypes

import torch

from mlxr.ops.cpu.cpu_build import load_library


def library(march: str | None = None) -> ctypes.CDLL | None:
    """The kernel library (march: as load_library's; tests build the plain-C path too)."""
    lib = load_library("half_linear", march)
    if lib is not None and not getattr(lib, "_typed", False):
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.mlxr_half_linear.argtypes = [ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
        lib.mlxr_half_linear.restype = None
        lib.mlxr_half_linear_simd.restype = ctypes.c_int
        lib._typed = True
    return lib


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.dtype == torch.float32 and weight.dtype == torch.float16 and x.is_cpu and weight.is_cpu
            and weight.dim() == 2 and weight.is_contiguous())


def half_linear_cpu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """x [..., k] float32 times weight [n, k] float16, transposed: float32 [..., n]. None where
    this build is not the AVX-512 one (plain C is slower than torch's fp16 product: the caller
    falls back to that). The caller checks `fits`."""
    lib = library()
    if lib is None or not lib.mlxr_half_linear_simd():
        return None
    return run(lib, x, weight)


def run(lib: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x = x if x.is_contiguous() else x.contiguous()
    n, k = weight.shape
    y = torch.empty(*x.shape[:-1], n, dtype=torch.float32)
    lib.mlxr_half_linear(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.numel() // k if k else 0, n, k,
                         torch.get_num_threads())
    return y
