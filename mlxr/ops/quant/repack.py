"""GGUF blocks rewritten once at load into the layout the repacked tensor-core GEMM reads
(repacked_triton.py): the weight's integers laid out K-major (N contiguous, so a tile of output
channels is one coalesced read) and each group's scale and offset as float32, so that

    W[n, k] = q[k, n] * scale[k // G, n] - offset[k // G, n]

exactly as gguf-py's dequantization computes it (every scale and offset here is a product that
is exact in float32: an fp16 significand times a 6- or 8-bit integer).

Two layouts, by the width of the type's integers:
- 4-bit (Q4_0, Q4_1, Q4_K): uint8 [K / 2, N]; in each run of 64 k, byte r holds k = r in its low
  nibble and k = r + 32 in its high one, so a 64-deep tile is one load whose two halves are the two
  32-wide groups: no shuffles in the kernel. 0.5 byte a weight.
- 8-bit (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0): int8 [K, N]. 1 byte a weight.
Plus float32 scales (and offsets, for the types that have them) [K / G, N]: 4 (8) bytes per G
weights. Memory against the file's blocks (docs/design.md): Q4_K 0.75 byte a weight against 0.5625,
Q6_K 1.25 against 0.82, Q8_0 1.125 against 1.0625. The file's blocks stay resident beside it (the
decode GEMV and the embedding read them), so a repacked layer costs this on top.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mlxr.ops.quant.block_types import quant_type
from mlxr.ops.quant.reference import _f16, _nibbles, k_scale_min
from mlxr.ops.quant.reference_extra import _bits_le, _halves

FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")
EIGHT_BIT = ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")
REPACK_TYPES = FOUR_BIT + EIGHT_BIT


@dataclass
class RepackedWeight:
    """q: uint8 [K/2, N] (bits 4) or int8 [K, N] (bits 8); scales / offsets float32 [K/G, N]
    (offsets None where the type has none)."""

    q: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor | None
    group: int
    bits: int
    n: int
    k: int

    def nbytes(self) -> int:
        extra = 0 if self.offsets is None else self.offsets.numel() * 4
        return self.q.numel() + self.scales.numel() * 4 + extra


def can_repack(qtype: str, k: int) -> bool:
    return qtype in REPACK_TYPES and k % 64 == 0


def repack(raw: torch.Tensor, qtype: str, k: int) -> RepackedWeight:
    """(N, row bytes) GGUF blocks -> RepackedWeight, on raw's device (vectorised over all blocks)."""
    if not can_repack(qtype, k):
        raise ValueError(f"{qtype} with K={k} has no repacked layout")
    t = quant_type(qtype)
    n = raw.shape[0]
    q, scales, offsets, group = _DECODE[qtype](raw.reshape(n, k // t.block_elems, t.block_bytes))
    q = q.reshape(n, k)
    scales, offsets = _k_major(scales, n), None if offsets is None else _k_major(offsets, n)
    if qtype in FOUR_BIT:
        pairs = q.to(torch.uint8).reshape(n, k // 64, 2, 32)
        packed = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(n, k // 2)
        return RepackedWeight(packed.t().contiguous(), scales, offsets, group, 4, n, k)
    return RepackedWeight(q.to(torch.int8).t().contiguous(), scales, offsets, group, 8, n, k)


def dequantize_repacked(w: RepackedWeight) -> torch.Tensor:
    """The (N, K) float32 weight from the repacked layout (the tests' check of the layout)."""
    if w.bits == 4:
        b = w.q.t().reshape(w.n, w.k // 64, 1, 32)
        q = torch.cat([b & 0x0F, b >> 4], dim=2).reshape(w.n, w.k).float()
    else:
        q = w.q.t().float()
    s = w.scales.t().repeat_interleave(w.group, dim=1)
    out = q * s
    if w.offsets is not None:
        out = out - w.offsets.t().repeat_interleave(w.group, dim=1)
    return out


def _k_major(per_group: torch.Tensor, n: int) -> torch.Tensor:
    return per_group.reshape(n, -1).float().t().contiguous()


def _q4_0(b):
    d = _f16(b[..., 0:2])
    return _nibbles(b[..., 2:18], 1, 16).flatten(-2), d, 8 * d, 32


def _q4_1(b):
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    return _halves(b[..., 4:20]), d, -m, 32


def _q5_0(b):
    d = _f16(b[..., 0:2])
    hi = _bits_le(b[..., 2:6], 32)
    q = (_nibbles(b[..., 6:22], 1, 16).flatten(-2).to(torch.int16) | (hi.to(torch.int16) << 4)) - 16
    return q, d, None, 32


def _q5_1(b):
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    q = _halves(b[..., 8:24]) | (_bits_le(b[..., 4:8], 32) << 4)
    return q, d, -m, 32


def _q8_0(b):
    return b[..., 2:34].contiguous().view(torch.int8), _f16(b[..., 0:2]), None, 32


def _k_scales(b):
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = k_scale_min(b[..., 4:16])
    return d * sc.float(), dmin * mn.float()


def _q4_k(b):
    scales, offsets = _k_scales(b)
    return _nibbles(b[..., 16:144], 4, 32), scales, offsets, 32


def _q5_k(b):
    scales, offsets = _k_scales(b)
    shifts = torch.arange(8, device=b.device, dtype=torch.uint8)[:, None]
    hi = (b[..., None, 16:48] >> shifts) & 1
    return _nibbles(b[..., 48:176], 4, 32) | (hi << 4), scales, offsets, 32


def _q6_k(b):
    sc = b[..., 192:208].contiguous().view(torch.int8).float()
    d = _f16(b[..., 208:210])
    ql = _nibbles(b[..., 0:128], 2, 64).reshape(*b.shape[:-1], 8, 32)
    shifts = torch.arange(0, 8, 2, device=b.device, dtype=torch.uint8)[:, None]
    qh = (b[..., 128:192].reshape(*b.shape[:-1], 2, 1, 32) >> shifts) & 3
    q = (ql | (qh.reshape(*b.shape[:-1], 8, 32) << 4)).to(torch.int16) - 32
    return q, d * sc, None, 16


_DECODE = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0, "Q4_K": _q4_k,
           "Q5_K": _q5_k, "Q6_K": _q6_k}
