"""Pure-torch dequantization of the extra GGUF block types (Q4_1, Q5_1, Q2_K, Q3_K, IQ4_NL,
IQ4_XS), bit-exact to gguf-py's numpy dequantizer: the same float32 operations in the same order
(Q4_1/Q5_1 `d * q + m`, Q2_K `(d * sc) * q - dmin * mn`, Q3_K `(d * sc) * q`, IQ4 `(d * sc) *
kvalue`), and of bitsandbytes NF4 blocks (`nf4[q] * absmax` in float32, as bnb computes it).
Blocks are (..., block_bytes) uint8; results (..., block_elems) float32."""
from __future__ import annotations

import torch

# The non-linear 4-bit grid of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl).
IQ4_KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
# The NF4 code of QLoRA (Dettmers et al. 2023, appendix E), as float32.
NF4_VALUES = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
              -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
              0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
              0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _halves(qs: torch.Tensor) -> torch.Tensor:
    """(..., 16) bytes -> (..., 32): the 16 low nibbles, then the 16 high ones."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _bits_le(b: torch.Tensor, n: int) -> torch.Tensor:
    """(..., n // 8) bytes -> (..., n) bits, little-endian within each byte."""
    shifts = torch.arange(8, device=b.device, dtype=torch.uint8)
    return ((b[..., :, None] >> shifts) & 1).reshape(*b.shape[:-1], n)


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    return d * _halves(b[..., 4:20]).float() + m


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    q = _halves(b[..., 8:24]) | (_bits_le(b[..., 4:8], 32) << 4)
    return d * q.float() + m


def _two_bit_planes(qs: torch.Tensor) -> torch.Tensor:
    """(..., 64) bytes -> (..., 256) 2-bit codes: per 32-byte half, shifts 0, 2, 4, 6 in turn."""
    shifts = torch.arange(0, 8, 2, device=qs.device, dtype=torch.uint8)[:, None]
    q = (qs.reshape(*qs.shape[:-1], 2, 1, 32) >> shifts) & 3
    return q.reshape(*qs.shape[:-1], 256)


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    sc = b[..., 0:16]
    d, dmin = _f16(b[..., 80:82]), _f16(b[..., 82:84])
    dl = (d * (sc & 0x0F).float())[..., None]
    ml = (dmin * (sc >> 4).float())[..., None]
    q = _two_bit_planes(b[..., 16:80]).reshape(*b.shape[:-1], 16, 16).float()
    return (dl * q - ml).flatten(-2)


def _q3_k_scales(s: torch.Tensor) -> torch.Tensor:
    low = torch.cat([s[..., 0:8] & 0x0F, s[..., 0:8] >> 4], dim=-1)
    shifts = torch.arange(0, 8, 2, device=s.device, dtype=torch.uint8)[:, None]
    high = ((s[..., None, 8:12] >> shifts) & 3).reshape(*s.shape[:-1], 16)
    return ((low | (high << 4)).to(torch.int16) - 32).float()


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[..., 108:110])
    dl = (d * _q3_k_scales(b[..., 96:108]))[..., None]
    ql = _two_bit_planes(b[..., 32:96]).to(torch.int16)
    missing = 1 - _bits_le(b[..., 0:32], 256).reshape(*b.shape[:-1], 32, 8).transpose(-1, -2)
    q = ql - (missing.reshape(*b.shape[:-1], 256).to(torch.int16) << 2)
    return (dl * q.float().reshape(*b.shape[:-1], 16, 16)).flatten(-2)


def _kvalues(q: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(IQ4_KVALUES, dtype=torch.float32, device=q.device)
    return table[q.long()]


def _iq4_nl(b: torch.Tensor) -> torch.Tensor:
    return _f16(b[..., 0:2]) * _kvalues(_halves(b[..., 2:18]))


def _iq4_xs(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[..., 0:2])
    sh = b[..., 2:4].to(torch.int32)
    sh = sh[..., 0] | (sh[..., 1] << 8)
    high = (sh[..., None] >> torch.arange(0, 16, 2, device=b.device)) & 3
    low = torch.stack([b[..., 4:8] & 0x0F, b[..., 4:8] >> 4], dim=-1).flatten(-2).to(torch.int32)
    dl = (d * ((low | (high << 4)) - 32).float())[..., None]  # (..., 8, 1)
    q = _halves(b[..., 8:136].reshape(*b.shape[:-1], 8, 16))
    return (dl * _kvalues(q)).flatten(-2)


def _nf4(b: torch.Tensor) -> torch.Tensor:
    absmax = b[..., 0:4].contiguous().view(torch.float32)
    qs = b[..., 4:36]
    q = torch.stack([qs >> 4, qs & 0x0F], dim=-1).flatten(-2)
    table = torch.tensor(NF4_VALUES, dtype=torch.float32, device=b.device)
    return table[q.long()] * absmax


EXTRA_DEQUANT = {"Q4_1": _q4_1, "Q5_1": _q5_1, "Q2_K": _q2_k, "Q3_K": _q3_k, "IQ4_NL": _iq4_nl,
                 "IQ4_XS": _iq4_xs, "NF4": _nf4}
