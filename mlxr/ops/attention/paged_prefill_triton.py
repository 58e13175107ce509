"""Paged prefill/extend attention in Triton: many sequences' new tokens, causal over the cache.

The layer writes the new tokens' K/V into the cache first, so a sequence's cached prefix
(prefix-cache hit, earlier chunk) and its new tokens are read the same way, through the
block table. Grid (query tile, sequence, KV head). A tile packs TQ tokens x G_PAD query
heads of one KV head into its BLOCK_M rows, so each K/V tile serves the whole GQA group.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlxr.ops.attention.attention_tiles_triton import (
    check_cache,
    dot_flags,
    gather_rows,
    load_kv_tile,
    mma,
    online_softmax_step,
    scaled_scores,
)


@triton.jit
def _attend_range(
    q, m, l, acc, k_ptr, v_ptr, table_row, t_lo, t_hi, hi, q_pos, window, kvh,
    scale, softcap, stride_b, stride_t, stride_h,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr,
    KV_FMT: tl.constexpr,
):
    """Fold the key tiles [t_lo, t_hi) into (m, l, acc); MASKED=False when every row sees
    every key of these tiles, which skips the causal/window/bounds masks."""
    offs_n = tl.arange(0, BLOCK_N)
    for t0 in range(t_lo, t_hi, BLOCK_N):
        t = t0 + offs_n
        valid = t < hi
        rows = gather_rows(table_row, t, t0, valid, kvh, stride_b, stride_t, stride_h, BLOCK_SIZE, BLOCK_N)
        k = load_kv_tile(k_ptr, rows, valid, q.dtype, HEAD_DIM, KV_FMT, MASKED)
        v = load_kv_tile(v_ptr, rows, valid, q.dtype, HEAD_DIM, KV_FMT, MASKED)
        s = scaled_scores(mma(q, tl.trans(k), PREC, UPCAST), scale, softcap, USE_SOFTCAP)
        if MASKED:
            see = valid[None, :] & (t[None, :] <= q_pos[:, None])
            if USE_WINDOW:
                see &= t[None, :] > q_pos[:, None] - window
            s = tl.where(see, s, float("-inf"))
        m, l, acc = online_softmax_step(s, m, l, acc, v, PREC, UPCAST)
    return m, l, acc


# The block table's row stride is its width, which changes with the batch: specialising on it
# (stride 1, a multiple of 16, other) compiled a new kernel, ~1 s, mid-serving.
@triton.jit(do_not_specialize=["stride_ts"])
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, table_ptr, seq_lens_ptr, q_start_ptr,
    scale, softcap, window,
    stride_qt, stride_qh, stride_b, stride_t, stride_h, stride_ts, stride_ot, stride_oh,
    GROUP: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, KV_FMT: tl.constexpr,
):
    TQ: tl.constexpr = BLOCK_M // G_PAD  # query tokens per tile
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    kvh = tl.program_id(2)
    q_start = tl.load(q_start_ptr + seq)
    q_len = tl.load(q_start_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx0 = seq_len - q_len  # position of the first new token

    offs_r = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    tok = tile * TQ + offs_r // G_PAD
    g = offs_r % G_PAD
    row_ok = (tok < q_len) & (g < GROUP)
    q_pos = ctx0 + tok
    q_off = (q_start + tok) * stride_qt + (kvh * GROUP + g) * stride_qh
    q = tl.load(q_ptr + q_off[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0)

    # Keys this tile can see: up to its last token; from its first token's window start.
    q_first = ctx0 + tile * TQ
    hi = ctx0 + tl.minimum(tile * TQ + TQ, q_len)
    lo = 0
    full_lo = 0  # from here every row of the tile sees every key, up to q_first
    if USE_WINDOW:
        lo = tl.maximum(q_first - window + 1, 0)
        full_lo = tl.maximum(hi - window, 0)
    lo = (lo // BLOCK_N) * BLOCK_N
    hi = tl.where(tile * TQ < q_len, hi, lo)  # tiles past this sequence's tokens do nothing
    mid_lo = tl.minimum(tl.maximum(tl.cdiv(full_lo, BLOCK_N) * BLOCK_N, lo), hi)
    mid_hi = tl.minimum(tl.maximum(((q_first + 1) // BLOCK_N) * BLOCK_N, mid_lo), hi)

    table_row = table_ptr + seq * stride_ts
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    m, l, acc = _attend_range(
        q, m, l, acc, k_ptr, v_ptr, table_row, lo, mid_lo, hi, q_pos, window, kvh, scale, softcap,
        stride_b, stride_t, stride_h, HEAD_DIM, BLOCK_SIZE, BLOCK_N, True,
        USE_WINDOW, USE_SOFTCAP, PREC, UPCAST, KV_FMT)
    m, l, acc = _attend_range(
        q, m, l, acc, k_ptr, v_ptr, table_row, mid_lo, mid_hi, hi, q_pos, window, kvh, scale, softcap,
        stride_b, stride_t, stride_h, HEAD_DIM, BLOCK_SIZE, BLOCK_N, False,
        USE_WINDOW, USE_SOFTCAP, PREC, UPCAST, KV_FMT)
    m, l, acc = _attend_range(
        q, m, l, acc, k_ptr, v_ptr, table_row, mid_hi, hi, hi, q_pos, window, kvh, scale, softcap,
        stride_b, stride_t, stride_h, HEAD_DIM, BLOCK_SIZE, BLOCK_N, True,
        USE_WINDOW, USE_SOFTCAP, PREC, UPCAST, KV_FMT)

    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    o_off = (q_start + tok) * stride_ot + (kvh * GROUP + g) * stride_oh
    tl.store(out_ptr + o_off[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def default_blocks(head_dim: int, g_pad: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps), the fastest of bench/kernels/kernels.py's sweep on an H200."""
    if head_dim >= 256:
        return max(64, g_pad), 32, 4
    if dtype == torch.float32:  # 128x128 fp32 tiles need more shared memory than Hopper has
        return max(128, g_pad), 64, 8
    if head_dim >= 128:
        return max(128, g_pad), 128, 8
    return max(64, g_pad), 128, 4


def paged_prefill_triton(
    q: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [S, max_blocks]
    seq_lens: torch.Tensor,  # [S]
    query_start_loc: torch.Tensor,  # [S + 1]
    max_query_len: int,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    out: torch.Tensor | None = None,
    num_warps: int | None = None,
    num_stages: int = 2,
) -> torch.Tensor:
    """Launcher; max_query_len (a host int) sizes the grid."""
    kv_fmt = check_cache(k_cache, v_cache, q)
    n_tokens, n_heads, dim = q.shape
    _, block_size, n_kv, _ = k_cache.shape
    n_seqs = seq_lens.shape[0]
    assert block_tables.dim() == 2 and block_tables.shape[0] == n_seqs and block_tables.stride(1) == 1
    assert query_start_loc.shape == (n_seqs + 1,) and not block_tables.dtype.is_floating_point
    group = n_heads // n_kv
    g_pad = triton.next_power_of_2(group)
    dm, dn, warps = default_blocks(dim, g_pad, q.dtype)
    block_m, block_n = block_m or dm, block_n or dn
    assert block_m >= max(16, g_pad) and block_n >= 16
    out = torch.empty_like(q) if out is None else out
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride(-1) == 1
    if n_tokens == 0:
        return out
    tq = block_m // g_pad
    prec, upcast = dot_flags(q.dtype)
    _prefill_kernel[(triton.cdiv(max_query_len, tq), n_seqs, n_kv)](
        q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc,
        scale, softcap or 0.0, sliding_window or 0,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, G_PAD=g_pad, HEAD_DIM=dim, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n,
        USE_WINDOW=sliding_window is not None, USE_SOFTCAP=softcap is not None,
        PREC=prec, UPCAST=upcast, KV_FMT=kv_fmt, num_warps=num_warps or warps, num_stages=num_stages,
    )
    return out
