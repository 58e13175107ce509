"""Launchers for the CPU kernels of quantized weights: one ctypes layer over the two libraries,
quant.c (CPU_INT_TYPES) and quant_extra.c (the other EXTRA_TYPES), which export the same entry points under
their own prefixes; a call picks the library by the weight's type.

quant.c's `qmatmul_cpu` quantizes the activations to 16 bits per 32 columns and multiplies with
integer dot products (prompts by weight panels, quant_panel.h: on AMX tiles where the CPU has
them, else VNNI); quant_extra.c dequantizes each block once into L1 and dots it in fp32. Both
read each weight byte once, so decode is bound by the (quantized) weight bytes, not by fp32
arithmetic. `dequantize_cpu` is exact to gguf-py.
"""
from __future__ import annotations

import ctypes

import torch

from mlxr.ops.cpu.cpu_build import load_library
from mlxr.ops.quant.block_types import CPU_INT_TYPES, quant_type

_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int

# Library -> (the prefix of its entry points, whether its matmul returns a status): quant.c's
# can fail to allocate scratch, quant_extra.c's needs none.
ENTRY_POINTS = {"quant": ("mlxr_", True), "quant_extra": ("mlxr_extra_", False)}

SIMD_LEVELS = {2: "avx512-vnni", 1: "avx2", 4: "neon-dotprod", 3: "neon", 0: "portable"}  # mlxr_simd_level
# Rows from which dequantize + torch's fp32 GEMM beats the integer kernel, by SIMD level (VNNI:
# never). AVX2 at 5632x2048 (Q4_K, Q8_0, Q6_K, Q5_0; one thread, a shared EPYC): 6-8 ms at 16
# rows and 24-30 at 64, where dequantize + GEMM took 25-28 and 36-59. NEON: not measured (no ARM
# machine), so the portable build's 16.
GEMM_MIN_ROWS = {1: 96, 0: 16}


def library(march: str | None = None, name: str = "quant") -> ctypes.CDLL | None:
    """Library `name` (ENTRY_POINTS) with its entry points typed as lib.qmatmul, lib.dequant and
    lib.dequant_rows, or None without a compiler. march: as load_library's."""
    lib = load_library(name, march)
    if lib is not None and not getattr(lib, "_typed", False):
        prefix, has_status = ENTRY_POINTS[name]
        lib.qmatmul = getattr(lib, prefix + "qmatmul")
        lib.qmatmul.argtypes = [_INT, _PTR, _I64, _I64, _PTR, _I64, _PTR, _INT]
        lib.qmatmul.restype = _INT if has_status else None
        lib.dequant = getattr(lib, prefix + "dequant_f32")
        lib.dequant.argtypes = [_INT, _PTR, _I64, _I64, _PTR, _INT]
        lib.dequant.restype = None
        lib.dequant_rows = getattr(lib, prefix + "dequant_rows_f32")
        lib.dequant_rows.argtypes = [_INT, _PTR, _I64, _PTR, _I64, _PTR]
        lib.dequant_rows.restype = None
        if name == "quant":
            lib.mlxr_simd_level.restype = _INT
            lib._level = lib.mlxr_simd_level()
            lib._vnni = lib._level == 2
            lib.mlxr_amx.restype = _INT
        lib._typed = True
    return lib


def library_for(qtype: str, march: str | None = None) -> ctypes.CDLL | None:
    """The library whose kernels take `qtype`."""
    return library(march, "quant" if qtype in CPU_INT_TYPES else "quant_extra")


def available(name: str = "quant") -> bool:
    return library(None, name) is not None


def kernel_path() -> str:
    """Which matmul kernel the CPU build runs: avx512-vnni (+amx where prompts take AMX tiles),
    avx2, neon-dotprod, neon, portable (or none)."""
    lib = library()
    if lib is None:
        return "none"
    return SIMD_LEVELS[lib.mlxr_simd_level()] + ("+amx" if amx() else "")


def amx() -> bool:
    """True when prompt matmuls (amx_min_rows rows and more) run on AMX tiles: a build for a CPU
    with AMX-INT8, the tile state granted by the OS, MLXR_AMX not 0."""
    lib = library()
    return lib is not None and bool(lib.mlxr_amx())


def amx_min_rows(qtype: str) -> int:
    """The fewest activation rows of a matmul on `qtype` weights that take AMX tiles (where
    amx() is True); 0 for a build without them."""
    lib = library()
    return 0 if lib is None else int(lib.mlxr_amx_min_rows(quant_type(qtype).code))


def panel_min_rows(qtype: str) -> int:
    """The fewest activation rows of a matmul on `qtype` weights that take weight panels (AMX
    tiles where amx() is True, else VNNI; quant_panel.h); 0 when none do (no AVX-512 VNNI, or
    MLXR_VNNI_PANELS=0 without AMX)."""
    lib = library()
    if lib is None:
        return 0
    lib.mlxr_panel_min_rows.restype = _INT
    return int(lib.mlxr_panel_min_rows(quant_type(qtype).code))


def gemm_min_rows() -> int:
    """Rows from which dequantize + torch's fp32 GEMM beats this build's integer kernel."""
    lib = library()
    return GEMM_MIN_ROWS[lib._level] if lib is not None and lib._level in GEMM_MIN_ROWS else GEMM_MIN_ROWS[0]


def vectorized() -> bool:
    """True when the kernels were built with AVX-512 VNNI (False: portable C or none)."""
    lib = library()
    return lib is not None and lib._vnni


def _check(raw: torch.Tensor, qtype: str, k: int) -> int:
    t = quant_type(qtype)
    assert raw.dtype == torch.uint8 and raw.dim() == 2 and raw.is_contiguous() and raw.device.type == "cpu"
    assert raw.shape[1] == t.row_bytes(k), (tuple(raw.shape), qtype, k)
    return t.code


def qmatmul_cpu(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """x (..., k) float32 times the (n, k) quantized weight transposed -> (..., n) float32."""
    # Decode calls this ~100 times a step on small matrices, where each torch call or tensor
    # attribute read costs 0.05-0.7 us: the checks read each attribute once, 2-D x is not reshaped.
    t = quant_type(qtype)
    n, row_bytes = raw.shape
    assert raw.dtype == torch.uint8 and raw.is_cpu and row_bytes == t.row_bytes(k), (tuple(raw.shape), qtype, k)
    assert x.dtype == torch.float32 and x.shape[-1] == k, (tuple(x.shape), x.dtype)
    flat = x.dim() == 2 and x.is_contiguous()
    rows = x if flat else x.reshape(-1, k).contiguous()  # reshape: a view if it can
    m = rows.shape[0]
    out = torch.empty(m, n, dtype=torch.float32)
    status = (lib or library_for(qtype)).qmatmul(t.code, raw.data_ptr(), n, k, rows.data_ptr(), m,
                                                 out.data_ptr(), torch.get_num_threads())
    if status:  # None from a library without a status
        raise MemoryError(f"quantized matmul failed ({status})")
    return out if flat else out.view(*x.shape[:-1], n)


def dequantize_cpu(raw: torch.Tensor, qtype: str, k: int, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """The (n, k) weight in float32, bit-exact to gguf-py."""
    code = _check(raw, qtype, k)
    out = torch.empty(raw.shape[0], k, dtype=torch.float32)
    (lib or library_for(qtype)).dequant(code, raw.data_ptr(), raw.shape[0], k, out.data_ptr(),
                                        torch.get_num_threads())
    return out


def dequantize_rows_cpu(raw: torch.Tensor, rows: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    """Rows `rows` of the weight in float32 (an embedding lookup); rows must be in range."""
    code = _check(raw, qtype, k)
    idx = rows.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty(idx.numel(), k, dtype=torch.float32)
    library_for(qtype).dequant_rows(code, raw.data_ptr(), k, idx.data_ptr(), idx.numel(), out.data_ptr())
    return out.reshape(*rows.shape, k)
