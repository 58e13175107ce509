"""Launchers for the CPU kernels of the extra GGUF types (mlxr/ops/quant/quant_extra.c)."""
from __future__ import annotations

import ctypes

import torch

from mlxr.ops.cpu_build import load_library
from mlxr.ops.quant.quant_types import EXTRA_TYPES

_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int


def library(march: str = "native") -> ctypes.CDLL | None:
    lib = load_library("quant_extra", march)
    if lib is not None and not getattr(lib, "_typed", False):
        lib.mlxr_extra_qmatmul.argtypes = [_INT, _PTR, _I64, _I64, _PTR, _I64, _PTR, _INT]
        lib.mlxr_extra_dequant_f32.argtypes = [_INT, _PTR, _I64, _I64, _PTR, _INT]
        lib.mlxr_extra_dequant_rows_f32.argtypes = [_INT, _PTR, _I64, _PTR, _I64, _PTR]
        lib._typed = True
    return lib


def available() -> bool:
    return library() is not None


def _code(raw: torch.Tensor, qtype: str, k: int) -> int:
    t = EXTRA_TYPES[qtype]
    assert raw.dtype == torch.uint8 and raw.dim() == 2 and raw.is_contiguous() and raw.is_cpu
    assert raw.shape[1] == t.row_bytes(k), (tuple(raw.shape), qtype, k)
    return t.code


def qmatmul_cpu(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """x (..., k) float32 times the (n, k) quantized weight transposed -> (..., n) float32."""
    code = _code(raw, qtype, k)
    assert x.dtype == torch.float32 and x.shape[-1] == k, (tuple(x.shape), x.dtype)
    rows = x.reshape(-1, k).contiguous()
    out = torch.empty(rows.shape[0], raw.shape[0], dtype=torch.float32)
    (lib or library()).mlxr_extra_qmatmul(code, raw.data_ptr(), raw.shape[0], k, rows.data_ptr(), rows.shape[0],
                                          out.data_ptr(), torch.get_num_threads())
    return out.view(*x.shape[:-1], raw.shape[0])


def dequantize_cpu(raw: torch.Tensor, qtype: str, k: int, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """The (n, k) weight in float32, bit-exact to gguf-py."""
    code = _code(raw, qtype, k)
    out = torch.empty(raw.shape[0], k, dtype=torch.float32)
    (lib or library()).mlxr_extra_dequant_f32(code, raw.data_ptr(), raw.shape[0], k, out.data_ptr(),
                                              torch.get_num_threads())
    return out


def dequantize_rows_cpu(raw: torch.Tensor, rows: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    """Rows `rows` of the weight in float32 (an embedding lookup); rows must be in range."""
    code = _code(raw, qtype, k)
    idx = rows.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty(idx.numel(), k, dtype=torch.float32)
    library().mlxr_extra_dequant_rows_f32(code, raw.data_ptr(), k, idx.data_ptr(), idx.numel(), out.data_ptr())
    return out.reshape(*rows.shape, k)
