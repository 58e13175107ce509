"""Rotary position embedding ("rotate half" layout), optionally fused with the K/V cache
write: torch reference and dispatchers."""
from __future__ import annotations

import torch

from mlxr.ops.attention.attention_cpu import rope_write_kv_cpu
from mlxr.ops.attention.paged_attention import write_kv
from mlxr.ops.backend import use_triton


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [T, 1, head_dim] for the given positions, in fp32 then cast."""
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_reference(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = rope_cos_sin(positions, inv_freq, q.dtype)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _triton_fits(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> bool:
    return q.dtype == k.dtype and q.shape[-1] % 2 == 0 and use_triton(q, k, positions)


def rotary_embedding(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D] and k [T, KH, D] rotated by their positions [T]."""
    if _triton_fits(q, k, positions):
        from mlxr.ops.rotary.rotary_triton import rotary_triton

        return rotary_triton(q, k, positions, inv_freq)
    return rotary_reference(q, k, positions, inv_freq)


def rotary_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k, store rotated k and v at their cache slots; returns (q, k) rotated."""
    if _triton_fits(q, k, positions) and k_cache.dtype == q.dtype == v.dtype:
        from mlxr.ops.rotary.rotary_triton import rotary_triton

        return rotary_triton(q, k, positions, inv_freq, (v, k_cache, v_cache, slot_mapping))
    q, k = rotary_reference(q, k, positions, inv_freq)
    write_kv(k, v, k_cache, v_cache, slot_mapping)
    return q, k


def rotary_write_kv_query(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """As rotary_write_kv, for callers that need only the rotated q: on CPU (fp32) one C call
    does it all, without the rotated k as a tensor."""
    if q.is_cpu:
        done = rope_write_kv_cpu(q, k, v, positions, inv_freq, k_cache, v_cache, slot_mapping)
        if done is not None:
            return done
    return rotary_write_kv(q, k, v, positions, inv_freq, k_cache, v_cache, slot_mapping)[0]


def qkv_rope_write_kv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    n_heads: int,
    n_kv: int,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor | None:
    """The rotated q [1, H, D] of one decode token, its rotated k and v stored in the cache, in
    one Triton kernel (projection, rope and cache write); None where that kernel does not apply
    (more than one token, not CUDA, weights other than 16-bit floats of x's dtype, another
    cache dtype): the caller then projects and calls rotary_write_kv_query."""
    if x.numel() != x.shape[-1] or weight.dtype not in (torch.bfloat16, torch.float16):
        return None
    if not (x.dtype == weight.dtype == k_cache.dtype) or weight.stride(-1) != 1 \
            or not use_triton(x, weight, k_cache, positions):
        return None
    from mlxr.ops.rotary.qkv_rope_triton import qkv_rope_triton

    return qkv_rope_triton(x.reshape(1, -1), weight, bias, n_heads, n_kv, positions, inv_freq,
                           k_cache, v_cache, slot_mapping)
