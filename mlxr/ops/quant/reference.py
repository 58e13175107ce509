"""Pure-torch dequantization of GGUF blocks, bit-exact to gguf-py's numpy dequantizer.

A quantized weight is a uint8 tensor (N, K // block_elems * block_bytes) holding each output
channel's blocks as the GGUF file stores them (mlxr/ops/quant/block_types.py). Everything here is
vectorised over all blocks at once and runs on any device torch runs on.

Float32 results equal `gguf.quants.dequantize` bit for bit: the same operations in the same
order (Q4_0 `d * (q - 8)`, Q5_0 `d * (q - 16)`, Q8_0 `q * d`, Q4_K/Q5_K `(d * sc) * q - (dmin * m)`,
Q6_K `(d * sc) * (q - 32)`, all in float32). Every product there is exact in float32 (an fp16
significand of 11 bits times small integers stays under 24 bits), so the only rounding is the
final subtraction of the K-quants; eager torch runs the multiply and the subtraction as separate
kernels, as numpy does.
"""
from __future__ import annotations

import torch

from mlxr.ops.quant.block_types import quant_type
from mlxr.ops.quant.reference_extra import EXTRA_DEQUANT


def _f16(b: torch.Tensor) -> torch.Tensor:
    """(..., 2) uint8 little-endian fp16 bytes -> (..., 1) float32."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """(..., groups * width) bytes -> (..., groups * 2, width): low nibbles, then high, per group."""
    qs = qs.reshape(*qs.shape[:-1], groups, 1, width)
    return torch.cat([qs & 0x0F, qs >> 4], dim=-2).reshape(*qs.shape[:-3], groups * 2, width)


def k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 packed bytes -> 8 six-bit scales and 8 six-bit mins (gguf-py's get_scale_min)."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[..., 0:2])
    q = _nibbles(b[..., 2:18], 1, 16).flatten(-2).to(torch.int16) - 8
    return d * q.float()


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[..., 0:2])
    qh = b[..., 2:6].to(torch.int64)
    qh = qh[..., 0] | (qh[..., 1] << 8) | (qh[..., 2] << 16) | (qh[..., 3] << 24)
    hi = (qh[..., None] >> torch.arange(32, device=b.device)) & 1
    ql = _nibbles(b[..., 6:22], 1, 16).flatten(-2).to(torch.int64)
    q = (ql | (hi << 4)) - 16
    return d * q.float()


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[..., 0:2])
    q = b[..., 2:34].contiguous().view(torch.int8).float()
    return q * d


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = k_scale_min(b[..., 4:16])
    dd = (d * sc.float())[..., None]
    dm = (dmin * mn.float())[..., None]
    q = _nibbles(b[..., 16:144], 4, 32).float()  # (..., 8, 32)
    return (dd * q - dm).flatten(-2)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = k_scale_min(b[..., 4:16])
    dd = (d * sc.float())[..., None]
    dm = (dmin * mn.float())[..., None]
    shifts = torch.arange(8, device=b.device, dtype=torch.uint8)[:, None]
    hi = (b[..., None, 16:48] >> shifts) & 1  # (..., 8, 32): bit s of qh[j] for sub-block s
    q = (_nibbles(b[..., 48:176], 4, 32) | (hi << 4)).float()
    return (dd * q - dm).flatten(-2)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    sc = b[..., 192:208].contiguous().view(torch.int8).float()
    d = _f16(b[..., 208:210])
    dd = (d * sc)[..., None]  # (..., 16, 1)
    ql = _nibbles(b[..., 0:128], 2, 64).reshape(*b.shape[:-1], 8, 32)
    shifts = torch.arange(0, 8, 2, device=b.device, dtype=torch.uint8)[:, None]
    qh = (b[..., 128:192].reshape(*b.shape[:-1], 2, 1, 32) >> shifts) & 3  # (..., 2, 4, 32)
    q = (ql | (qh.reshape(*b.shape[:-1], 8, 32) << 4)).to(torch.int16) - 32
    q = q.float().reshape(*b.shape[:-1], 16, 16)
    return (dd * q).flatten(-2)


_DEQUANT = {"Q4_0": _q4_0, "Q5_0": _q5_0, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
            **EXTRA_DEQUANT}


def dequantize(raw: torch.Tensor, qtype: str, k: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(N, row_bytes) uint8 GGUF blocks -> the (N, k) weight: float32 exact to gguf-py, then `dtype`."""
    t = quant_type(qtype)
    assert raw.dtype == torch.uint8 and raw.dim() == 2, (raw.dtype, tuple(raw.shape))
    assert raw.shape[1] == t.row_bytes(k), (tuple(raw.shape), qtype, k)
    n = raw.shape[0]
    blocks = raw.reshape(n, k // t.block_elems, t.block_bytes)
    return _DEQUANT[qtype](blocks).reshape(n, k).to(dtype)


def dequantize_rows(
    raw: torch.Tensor, rows: torch.Tensor, qtype: str, k: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Only the gathered rows (an embedding lookup): shape rows.shape + (k,)."""
    idx = rows.reshape(-1).to(device=raw.device, dtype=torch.long)
    return dequantize(raw.index_select(0, idx), qtype, k, dtype).reshape(*rows.shape, k)


def qmatmul_reference(x: torch.Tensor, raw: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    """x (..., k) @ dequantize(raw).T -> (..., N) in x.dtype, multiplied and summed in float32."""
    assert x.shape[-1] == k, (tuple(x.shape), k)
    w = dequantize(raw, qtype, k, torch.float32)
    out = x.reshape(-1, k).float() @ w.T
    return out.to(x.dtype).reshape(*x.shape[:-1], raw.shape[0])
