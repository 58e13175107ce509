"""KV cache storage formats: which names exist, what one cache row costs, and the torch
quantize / dequantize of the packed ones (the reference the C and Triton kernels are tested on).

A cache row is one token's one KV head (head_dim values). bf16 and fp16 rows are plain tensors
of that dtype. The packed formats cut a row into blocks of 32 values, each a little-endian fp16
scale followed by its payload, stored as bytes in the cache's last dimension:
- q8_0: GGML's block_q8_0 (scale = max |x| / 127, 32 int8); the cache tensor is int8;
- q4_0: GGML's block_q4_0 (scale = the signed extreme / -8, 16 bytes of nibbles: low nibbles
  values 0..15, high nibbles 16..31, value = (q - 8) * scale); the cache tensor is uint8;
- fp8: 32 float8 e4m3 values scaled by max |x| / 448 (so no block overflows or wastes range);
  the cache tensor is uint8 too, told from q4_0 by its row length (34 bytes a block, not 18).
The format therefore follows from the cache tensor and the head dim alone (kv_format).

q4_0 rows hold K and V turned by the normalised Hadamard matrix H of the head dim (orthogonal and
symmetric: q.k = qH.kH, and sum p vH = (sum p v)H, so attention over the turned rows, turned back,
is attention over the rows). It spreads a row's outlier channels over its blocks: a block's
scale is no longer one channel's, which cost 4-bit K most of the others' values (SmolLM2's
perplexity rose 18% with plain q4_0 rows)."""
from __future__ import annotations

import functools

import torch

from mlxr.config import KV_CACHE_DTYPES
PACKED = ("q8_0", "q4_0", "fp8")
QK = 32  # values per packed block
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "fp8": 34}
STORAGE = {"q8_0": torch.int8, "q4_0": torch.uint8, "fp8": torch.uint8}
FLOATS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FP8_MAX = 448.0


def check_kv_dtype(name: str, head_dim: int | None = None) -> str:
    """The name, lower-cased, if it is a KV cache dtype (and fits head_dim); ValueError otherwise."""
    key = name.strip().lower()
    if key not in KV_CACHE_DTYPES:
        raise ValueError(f"kv cache dtype {name!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
    if key in PACKED and head_dim is not None and head_dim % QK:
        raise ValueError(f"kv cache dtype {key} needs a head dim that is a multiple of {QK} (this model's is {head_dim})")
    return key


def row_bytes(name: str, head_dim: int, model_dtype: torch.dtype) -> int:
    """Bytes one cache row (head_dim values) takes in format `name` ("auto": the model's dtype)."""
    if name in PACKED:
        return head_dim // QK * BLOCK_BYTES[name]
    return head_dim * torch.empty((), dtype=storage_dtype(name, model_dtype)).element_size()


def storage_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    if name in PACKED:
        return STORAGE[name]
    return FLOATS.get(name, model_dtype)


def row_width(name: str, head_dim: int) -> int:
    """The cache tensor's last dimension for format `name`."""
    return head_dim // QK * BLOCK_BYTES[name] if name in PACKED else head_dim


def kv_format(cache: torch.Tensor, head_dim: int) -> str:
    """The format of a cache tensor whose rows hold head_dim values: a float dtype's name, or a
    packed format's."""
    if cache.dtype == torch.int8:
        return "q8_0"
    if cache.dtype == torch.uint8:
        return "q4_0" if cache.shape[-1] * QK == head_dim * BLOCK_BYTES["q4_0"] else "fp8"
    for name, dtype in FLOATS.items():
        if cache.dtype == dtype:
            return name
    raise ValueError(f"no KV cache format stores {cache.dtype}")


def is_packed(cache: torch.Tensor) -> bool:
    return cache.dtype in (torch.int8, torch.uint8)


ROTATED = ("q4_0",)


def is_rotated(cache: torch.Tensor, head_dim: int) -> bool:
    """Whether the cache's rows are stored turned by hadamard(head_dim) (q4_0's)."""
    return cache.dtype == torch.uint8 and kv_format(cache, head_dim) in ROTATED


@functools.cache
def _hadamard(n: int, device: torch.device) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:  # Sylvester's construction
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / n ** 0.5).to(device)


def hadamard(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The normalised n x n Hadamard matrix (n a power of 2), orthogonal and symmetric."""
    assert n & (n - 1) == 0, "a Hadamard turn needs a power-of-2 head dim"
    return _hadamard(n, device).to(dtype)


def _scale_bytes(scale: torch.Tensor) -> torch.Tensor:
    return scale.to(torch.float16).view(torch.uint8).reshape(*scale.shape[:-1], 2)


def quantize_rows(x: torch.Tensor, name: str) -> torch.Tensor:
    """[..., d] floats -> [..., d / 32 * block bytes] packed rows of format `name`."""
    blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // QK, QK)
    if name == "q8_0":
        scale = blocks.abs().amax(-1, keepdim=True) / 127
        inv = torch.where(scale == 0, 0.0, 1.0 / scale)
        y = blocks * inv
        a = y.abs()  # rounded half away from zero, exactly (as GGML's roundf)
        payload = (torch.sign(y) * (a.floor() + (2 * (a - a.floor())).floor())).to(torch.int8).view(torch.uint8)
    elif name == "q4_0":
        extreme = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))
        scale = extreme / -8
        inv = torch.where(scale == 0, 0.0, 1.0 / scale)
        q = torch.trunc(blocks * inv + 8.5).clamp(0, 15).to(torch.uint8)
        payload = q[..., : QK // 2] | (q[..., QK // 2:] << 4)
    elif name == "fp8":
        scale = (blocks.abs().amax(-1, keepdim=True) / FP8_MAX).to(torch.float16).float()
        inv = torch.where(scale == 0, 0.0, 1.0 / scale)
        payload = (blocks * inv).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    else:
        raise ValueError(f"{name} is not a packed KV format")
    packed = torch.cat([_scale_bytes(scale), payload], -1)
    return packed.reshape(*x.shape[:-1], -1).view(STORAGE[name])


def dequantize_rows(packed: torch.Tensor, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[..., d / 32 * block bytes] packed rows of format `name` -> [..., d] of dtype."""
    size = BLOCK_BYTES[name]
    raw = packed.view(torch.uint8)
    blocks = raw.reshape(*raw.shape[:-1], raw.shape[-1] // size, size)
    scale = blocks[..., :2].contiguous().view(torch.float16).float()
    body = blocks[..., 2:]
    if name == "q8_0":
        values = body.contiguous().view(torch.int8).float()
    elif name == "q4_0":
        values = torch.cat([body & 15, body >> 4], -1).float() - 8
    else:
        values = body.contiguous().view(torch.float8_e4m3fn).float()
    return (values * scale).reshape(*raw.shape[:-1], -1).to(dtype)


def store_rows(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """x [..., d] in the form the cache holds (its dtype, or its packed format)."""
    if is_packed(cache):
        return quantize_rows(x, kv_format(cache, x.shape[-1]))
    return x.to(cache.dtype)


def load_rows(cache_rows: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows [..., width] back as [..., head_dim] values of dtype."""
    if is_packed(cache_rows):
        return dequantize_rows(cache_rows, kv_format(cache_rows, head_dim), dtype)
    return cache_rows.to(dtype)
