"""Rotary embedding in Triton, optionally writing the rotated K and the V of each token
into the paged cache through the slot mapping (one pass instead of rope + write_kv)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# (v, k_cache, v_cache, slot_mapping) for the fused cache write
CacheWrite = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, stride_src, stride_dst, cos, sin, offs_f, n_heads,
                  HALF: tl.constexpr, H_PAD: tl.constexpr, F_PAD: tl.constexpr):
    """Rotate n_heads rows of one token; returns the rotated halves (fp32)."""
    heads = tl.arange(0, H_PAD)
    ok = (heads < n_heads)[:, None] & (offs_f < HALF)[None, :]
    lo = heads[:, None] * stride_src + offs_f[None, :]
    x1 = tl.load(src_ptr + lo, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src_ptr + lo + HALF, mask=ok, other=0.0).to(tl.float32)
    y1 = x1 * cos[None, :] - x2 * sin[None, :]
    y2 = x2 * cos[None, :] + x1 * sin[None, :]
    out = heads[:, None] * stride_dst + offs_f[None, :]
    tl.store(dst_ptr + out, y1.to(dst_ptr.dtype.element_ty), mask=ok)
    tl.store(dst_ptr + out + HALF, y2.to(dst_ptr.dtype.element_ty), mask=ok)
    return y1, y2, ok


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, inv_freq_ptr, q_out_ptr, k_out_ptr,
    k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_qot, stride_qoh, stride_kot, stride_koh, stride_cb, stride_ct, stride_ch,
    n_heads, n_kv, block_size,
    HALF: tl.constexpr, F_PAD: tl.constexpr, H_PAD: tl.constexpr, KH_PAD: tl.constexpr,
    WRITE_CACHE: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    offs_f = tl.arange(0, F_PAD)
    pos = tl.load(pos_ptr + tok).to(tl.float32)
    freq = pos * tl.load(inv_freq_ptr + offs_f, mask=offs_f < HALF, other=0.0).to(tl.float32)
    cos = tl.cos(freq)
    sin = tl.sin(freq)
    _rotate_heads(q_ptr + tok * stride_qt, q_out_ptr + tok * stride_qot, stride_qh, stride_qoh,
                  cos, sin, offs_f, n_heads, HALF, H_PAD, F_PAD)
    k1, k2, ok = _rotate_heads(k_ptr + tok * stride_kt, k_out_ptr + tok * stride_kot, stride_kh,
                               stride_koh, cos, sin, offs_f, n_kv, HALF, KH_PAD, F_PAD)
    if WRITE_CACHE:
        slot = tl.load(slot_ptr + tok)
        if slot >= 0:  # a negative slot marks a padding token with nowhere to go
            base = (slot // block_size) * stride_cb + (slot % block_size) * stride_ct
            dst = base + tl.arange(0, KH_PAD)[:, None] * stride_ch + offs_f[None, :]
            ty = k_cache_ptr.dtype.element_ty
            tl.store(k_cache_ptr + dst, k1.to(ty), mask=ok)
            tl.store(k_cache_ptr + dst + HALF, k2.to(ty), mask=ok)
            src = tok * stride_vt + tl.arange(0, KH_PAD)[:, None] * stride_vh + offs_f[None, :]
            v1 = tl.load(v_ptr + src, mask=ok, other=0.0)
            v2 = tl.load(v_ptr + src + HALF, mask=ok, other=0.0)
            tl.store(v_cache_ptr + dst, v1.to(ty), mask=ok)
            tl.store(v_cache_ptr + dst + HALF, v2.to(ty), mask=ok)


def _check_cache_write(k: torch.Tensor, cache: CacheWrite) -> None:
    v, k_cache, v_cache, slots = cache
    assert v.shape == k.shape and v.stride(-1) == 1
    assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    assert k_cache.shape[2:] == k.shape[1:], "cache is [num_blocks, block_size, num_kv_heads, head_dim]"
    assert slots.shape == (k.shape[0],) and not slots.dtype.is_floating_point


def rotary_triton(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, KH, D]
    positions: torch.Tensor,  # [T]
    inv_freq: torch.Tensor,  # [D / 2]
    cache: CacheWrite | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launcher: returns new rotated (q, k); with `cache`, also stores rotated k and v."""
    n_tokens, n_heads, dim = q.shape
    assert k.dim() == 3 and k.shape[0] == n_tokens and k.shape[2] == dim and dim % 2 == 0
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and q.dtype == k.dtype
    assert positions.shape == (n_tokens,) and inv_freq.shape == (dim // 2,)
    q_out, k_out = (torch.empty_like(q), torch.empty_like(k)) if out is None else out
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.stride(-1) == k_out.stride(-1) == 1
    if cache is not None:
        _check_cache_write(k, cache)
        v, k_cache, v_cache, slots = cache
    else:
        v, k_cache, v_cache, slots = k, k_out, k_out, positions  # unused: WRITE_CACHE is off
    cs = k_cache.stride() if cache is not None else (0, 0, 0)
    block_size = k_cache.shape[1] if cache is not None else 1
    if n_tokens == 0:
        return q_out, k_out
    half = dim // 2
    _rope_kernel[(n_tokens,)](
        q, k, v, positions, inv_freq, q_out, k_out, k_cache, v_cache, slots,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), *cs[:3],
        n_heads, k.shape[1], block_size,
        HALF=half, F_PAD=triton.next_power_of_2(half), H_PAD=triton.next_power_of_2(n_heads),
        KH_PAD=triton.next_power_of_2(k.shape[1]), WRITE_CACHE=cache is not None, num_warps=4,
    )
    return q_out, k_out
