"""One decode token's q/k/v projection with the rotary embedding and the K/V cache write in
its epilogue, in Triton: at batch 1 the separate rope kernel is a launch of its own per layer
(~3 us of a ~45 us layer, bench/probes/step_probe.py), for a few thousand multiply-adds.

Each program takes two rows of the merged [q; k; v] weight and dots them with x (the GEMV's
loop). For q and k the two rows are a rotary pair, i and i + head_dim/2 of one head, so the
program rotates its two sums itself; v programs take two neighbouring rows. q goes to `q_out`,
rotated k and v to their cache slot."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlxr.ops.linear.gemv_triton import launch_config, row_dots
from mlxr.ops.pdl_triton import pdl_launch, wait_for_inputs


@triton.jit
def _qkv_rope_kernel(
    x_ptr, w_ptr, bias_ptr, pos_ptr, inv_freq_ptr, slot_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
    K, stride_wn, stride_cb, stride_ct, stride_ch, block_size,
    N_HEADS: tl.constexpr, N_KV: tl.constexpr, HEAD_DIM: tl.constexpr,
    BK: tl.constexpr, EVEN: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    HALF: tl.constexpr = HEAD_DIM // 2
    Q_ROWS: tl.constexpr = N_HEADS * HEAD_DIM
    KV_ROWS: tl.constexpr = N_KV * HEAD_DIM
    p = tl.program_id(0)
    in_q = p < N_HEADS * HALF
    rotated = p < (N_HEADS + N_KV) * HALF
    pair = tl.where(in_q, p, p - N_HEADS * HALF)
    i = pair % HALF  # frequency index of a rotary pair
    first = tl.where(rotated, tl.where(in_q, 0, Q_ROWS) + (pair // HALF) * HEAD_DIM + i,
                     Q_ROWS + KV_ROWS + 2 * (p - (N_HEADS + N_KV) * HALF))
    second = tl.where(rotated, first + HALF, first + 1)
    two = tl.arange(0, 2)
    rows = tl.where(two == 0, first, second)
    sums = row_dots(x_ptr, w_ptr, rows, K, 0, stride_wn, 1, 2, BK, EVEN)[0]
    if HAS_BIAS:
        sums += tl.load(bias_ptr + rows).to(tl.float32)
    a = tl.sum(tl.where(two == 0, sums, 0.0))
    b = tl.sum(tl.where(two == 1, sums, 0.0))
    freq = tl.load(pos_ptr).to(tl.float32) * tl.load(inv_freq_ptr + i).to(tl.float32)
    cos, sin = tl.cos(freq), tl.sin(freq)
    y = tl.where(rotated, tl.where(two == 0, a * cos - b * sin, b * cos + a * sin), sums)
    pv = p + 0 * two  # masks as [2] vectors
    tl.store(q_out_ptr + rows, y.to(q_out_ptr.dtype.element_ty), mask=pv < N_HEADS * HALF)
    slot = tl.load(slot_ptr)
    col = rows - Q_ROWS - tl.where(rotated, 0, KV_ROWS)  # kv_head * HEAD_DIM + d
    dst = (slot // block_size) * stride_cb + (slot % block_size) * stride_ct \
        + (col // HEAD_DIM) * stride_ch + col % HEAD_DIM
    keep = (slot + 0 * two) >= 0  # a negative slot marks a padding token
    in_k = (pv >= N_HEADS * HALF) & (pv < (N_HEADS + N_KV) * HALF)
    tl.store(k_cache_ptr + dst, y.to(k_cache_ptr.dtype.element_ty), mask=keep & in_k)
    tl.store(v_cache_ptr + dst, y.to(v_cache_ptr.dtype.element_ty), mask=keep & (pv >= (N_HEADS + N_KV) * HALF))


def qkv_rope_triton(
    x: torch.Tensor,  # [1, hidden]
    weight: torch.Tensor,  # [(H + 2 KH) * D, hidden]: q, k, v rows
    bias: torch.Tensor | None,
    n_heads: int,
    n_kv: int,
    positions: torch.Tensor,  # [1]
    inv_freq: torch.Tensor,  # [D / 2]
    k_cache: torch.Tensor,  # [num_blocks, block_size, KH, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [1]
    q_out: torch.Tensor | None = None,
    block_k: int | None = None,
) -> torch.Tensor:
    """Launcher: returns the rotated q [1, H, D]; rotated k and v land in the cache."""
    hidden = x.shape[-1]
    dim = 2 * inv_freq.shape[0]
    assert x.shape == (1, hidden) and x.stride(1) == 1 and x.dtype == weight.dtype
    assert weight.shape == ((n_heads + 2 * n_kv) * dim, hidden) and weight.stride(1) == 1
    assert bias is None or bias.shape == (weight.shape[0],)
    assert positions.shape == (1,) and slot_mapping.shape == (1,) and not slot_mapping.dtype.is_floating_point
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.shape[2:] == (n_kv, dim) and k_cache.stride(-1) == 1
    q_out = torch.empty((1, n_heads, dim), dtype=x.dtype, device=x.device) if q_out is None else q_out
    assert q_out.shape == (1, n_heads, dim) and q_out.is_contiguous()
    block_k = min(block_k or launch_config(weight.shape[0], hidden)[1], triton.next_power_of_2(hidden))
    _qkv_rope_kernel[(weight.shape[0] // 2,)](
        x, weight, weight if bias is None else bias, positions, inv_freq, slot_mapping, q_out,
        k_cache, v_cache, hidden, weight.stride(0), *k_cache.stride()[:3], k_cache.shape[1],
        N_HEADS=n_heads, N_KV=n_kv, HEAD_DIM=dim, BK=block_k, EVEN=hidden % block_k == 0,
        HAS_BIAS=bias is not None, num_warps=4, **pdl_launch(x.device),
    )
    return q_out
