"""Rotary embedding in Triton, optionally writing the rotated K and the V of each token
into the paged cache through the slot mapping (one pass instead of rope + write_kv)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlxr.ops.pdl_triton import pdl_launch, wait_for_inputs

# (v, k_cache, v_cache, slot_mapping) for the fused cache write
CacheWrite = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@triton.jit
def _load_heads(src_ptr, stride_src, offs_f, n_heads, HALF: tl.constexpr, H_PAD: tl.constexpr):
    """The two halves (fp32) of n_heads rows of one token, and their mask."""
    heads = tl.arange(0, H_PAD)
    ok = (heads < n_heads)[:, None] & (offs_f < HALF)[None, :]
    lo = heads[:, None] * stride_src + offs_f[None, :]
    x1 = tl.load(src_ptr + lo, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src_ptr + lo + HALF, mask=ok, other=0.0).to(tl.float32)
    return x1, x2, ok


@triton.jit
def _store_heads(dst_ptr, stride_dst, y1, y2, ok, offs_f, HALF: tl.constexpr, H_PAD: tl.constexpr):
    out = tl.arange(0, H_PAD)[:, None] * stride_dst + offs_f[None, :]
    tl.store(dst_ptr + out, y1.to(dst_ptr.dtype.element_ty), mask=ok)
    tl.store(dst_ptr + out + HALF, y2.to(dst_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, inv_freq_ptr, q_out_ptr, k_out_ptr,
    k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_qot, stride_qoh, stride_kot, stride_koh, stride_cb, stride_ct, stride_ch,
    n_heads, n_kv, block_size,
    HALF: tl.constexpr, F_PAD: tl.constexpr, H_PAD: tl.constexpr, KH_PAD: tl.constexpr,
    WRITE_CACHE: tl.constexpr, PDL: tl.constexpr,
):
    # Every load is issued before the first store: a decode step runs this for one token,
    # where the time is memory round trips, and a load after a store waits for it.
    wait_for_inputs(PDL)
    tok = tl.program_id(0).to(tl.int64)
    offs_f = tl.arange(0, F_PAD)
    pos = tl.load(pos_ptr + tok).to(tl.float32)
    inv_freq = tl.load(inv_freq_ptr + offs_f, mask=offs_f < HALF, other=0.0).to(tl.float32)
    q1, q2, q_ok = _load_heads(q_ptr + tok * stride_qt, stride_qh, offs_f, n_heads, HALF, H_PAD)
    k1, k2, k_ok = _load_heads(k_ptr + tok * stride_kt, stride_kh, offs_f, n_kv, HALF, KH_PAD)
    if WRITE_CACHE:
        slot = tl.load(slot_ptr + tok)
        v1, v2, _ = _load_heads(v_ptr + tok * stride_vt, stride_vh, offs_f, n_kv, HALF, KH_PAD)
    freq = pos * inv_freq
    cos = tl.cos(freq)[None, :]
    sin = tl.sin(freq)[None, :]
    _store_heads(q_out_ptr + tok * stride_qot, stride_qoh, q1 * cos - q2 * sin, q2 * cos + q1 * sin,
                 q_ok, offs_f, HALF, H_PAD)
    rk1, rk2 = k1 * cos - k2 * sin, k2 * cos + k1 * sin
    _store_heads(k_out_ptr + tok * stride_kot, stride_koh, rk1, rk2, k_ok, offs_f, HALF, KH_PAD)
    if WRITE_CACHE:
        if slot >= 0:  # a negative slot marks a padding token with nowhere to go
            base = (slot // block_size) * stride_cb + (slot % block_size) * stride_ct
            _store_heads(k_cache_ptr + base, stride_ch, rk1, rk2, k_ok, offs_f, HALF, KH_PAD)
            _store_heads(v_cache_ptr + base, stride_ch, v1, v2, k_ok, offs_f, HALF, KH_PAD)


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
        **pdl_launch(q.device),
    )
    return q_out, k_out
