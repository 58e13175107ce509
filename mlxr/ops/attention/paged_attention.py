"""Paged attention: torch reference (CPU and any device) and the Triton kernels
(paged_decode_triton.py, paged_prefill_triton.py) behind one dispatcher.

Cache layout per layer: [num_blocks, block_size, num_kv_heads, head_dim] for K and V.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from mlxr.ops.attention.attention_cpu import paged_decode_cpu, paged_prefill_cpu
from mlxr.ops.attention.kv_quant import load_rows, store_rows
from mlxr.ops.backend import use_triton

if TYPE_CHECKING:
    from mlxr.ops.attention.attn_metadata import AttnMetadata


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each new token's K/V at its slot (block * block_size + offset), in the cache's
    dtype or packed format (ops/attention/kv_quant.py)."""
    nb, bs, nkv, width = k_cache.shape
    k_cache.view(nb * bs, nkv, width).index_copy_(0, slot_mapping, store_rows(k, k_cache))
    v_cache.view(nb * bs, nkv, width).index_copy_(0, slot_mapping, store_rows(v, v_cache))


def gather_context(
    cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """The first seq_len cached tokens of one sequence: [seq_len, num_kv_heads, head_dim]."""
    block_size = cache.shape[1]
    n_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache.index_select(0, block_table[:n_blocks])
    return blocks.reshape(n_blocks * block_size, *cache.shape[2:])[:seq_len]


def attention_mask(
    q_len: int, seq_len: int, sliding_window: int | None, device: torch.device,
    spans: list[tuple[int, int]] = (),
) -> torch.Tensor:
    """[q_len, seq_len] bool, True where query i (at position seq_len - q_len + i) may look:
    causally, or anywhere inside a bidirectional span holding both; the window cuts both."""
    q_pos = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
    k_pos = torch.arange(seq_len, device=device)[None, :]
    mask = k_pos <= q_pos
    for start, end in spans:
        mask |= (q_pos >= start) & (q_pos < end) & (k_pos >= start) & (k_pos < end)
    if sliding_window is not None:
        mask &= k_pos > q_pos - sliding_window
    return mask


def attend_one(
    q: torch.Tensor,  # [q_len, H, D]
    k: torch.Tensor,  # [seq_len, KH, D]
    v: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
    spans: list[tuple[int, int]] = (),
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal (optionally windowed) attention of one sequence's queries over its context."""
    q_len, n_heads, _ = q.shape
    seq_len, n_kv, _ = k.shape
    group = n_heads // n_kv
    # [KH, group * q_len, D]: query heads sharing a KV head are stacked, so GQA needs no copy of K/V.
    qh = q.permute(1, 0, 2).reshape(n_kv, group * q_len, -1)
    kh, vh = k.permute(1, 0, 2), v.permute(1, 0, 2)
    scores = torch.matmul(qh.float(), kh.float().transpose(1, 2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    mask = attention_mask(q_len, seq_len, sliding_window, q.device, spans).repeat(group, 1)
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = None if sinks is None else sinks.float().view(n_kv, group, 1).repeat_interleave(q_len, 1)
    out = torch.matmul(_softmax(scores, sink), vh.float())  # [KH, group*q_len, D]
    return out.reshape(n_heads, q_len, -1).permute(1, 0, 2).to(q.dtype)


def _softmax(scores: torch.Tensor, sink: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim; with a sink (gpt-oss), each row's softmax also counts one more
    logit, the head's sink, whose weight is dropped: the row's weights sum to less than one."""
    if sink is None:
        return F.softmax(scores, dim=-1)
    return F.softmax(torch.cat([scores, sink.expand(*scores.shape[:-1], 1)], dim=-1), dim=-1)[..., :-1]


def paged_attention_reference(
    q: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: "AttnMetadata",
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each sequence's new tokens attend causally over its whole cached context."""
    out = torch.empty_like(q)
    start = 0
    spans = meta.bidirectional
    dim = q.shape[-1]
    for s, (q_len, seq_len) in enumerate(zip(meta.query_lens_list, meta.seq_lens_list)):
        table = meta.block_tables[s]
        k = load_rows(gather_context(k_cache, table, seq_len), dim, torch.float32)
        v = load_rows(gather_context(v_cache, table, seq_len), dim, torch.float32)
        out[start : start + q_len] = attend_one(
            q[start : start + q_len], k, v, scale, sliding_window, softcap, spans[s] if spans else (), sinks
        )
        start += q_len
    return out


def paged_decode_reference(
    q: torch.Tensor,  # [S, H, D]: one new token per sequence
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: "AttnMetadata",
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode for a whole batch at once: gather every block table (padded), mask by length.
    Same math as attend_one, without a Python loop over sequences."""
    n_seqs, n_heads, dim = q.shape
    _, block_size, n_kv, _ = k_cache.shape
    group = n_heads // n_kv
    tables = meta.block_tables  # [S, B]
    width = tables.shape[1] * block_size
    k = load_rows(k_cache[tables], dim, torch.float32).reshape(n_seqs, width, n_kv, dim).permute(0, 2, 3, 1)  # [S, KH, D, W]
    v = load_rows(v_cache[tables], dim, torch.float32).reshape(n_seqs, width, n_kv, dim).permute(0, 2, 1, 3)  # [S, KH, W, D]
    qh = q.reshape(n_seqs, n_kv, group, dim)
    scores = torch.matmul(qh.float(), k.float()) * scale  # [S, KH, group, W]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    pos = torch.arange(width, device=q.device)[None, :]
    last = (meta.seq_lens - 1)[:, None]  # position of the new token
    mask = pos <= last
    if sliding_window is not None:
        mask &= pos > last - sliding_window
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    sink = None if sinks is None else sinks.float().view(1, n_kv, group, 1)
    out = torch.matmul(_softmax(scores, sink), v.float())  # [S, KH, group, D]
    return out.reshape(n_seqs, n_heads, dim).to(q.dtype)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: "AttnMetadata",
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dispatcher: Triton kernels for CUDA tensors (unless MLXR_KERNELS=reference), the C kernels
    for fp32 CPU queries under inference mode (over a cache of any kv_quant.py format), else the
    torch reference. Decode-only batches
    take the decode kernels, others prefill. A step with bidirectional spans (image tokens)
    takes the reference, whose mask holds them. Attention sinks (one logit per head that takes
    a share of each softmax, gpt-oss's) run in the C kernels and the references; the Triton
    kernels do not take them yet, so on CUDA they run the references."""
    if sinks is not None and (not q.is_cpu or meta.bidirectional is not None):
        if meta.is_decode_only:
            return paged_decode_reference(q, k_cache, v_cache, meta, scale, sliding_window, softcap, sinks)
        return paged_attention_reference(q, k_cache, v_cache, meta, scale, sliding_window, softcap, sinks)
    if meta.bidirectional is not None:
        return paged_attention_reference(q, k_cache, v_cache, meta, scale, sliding_window, softcap)
    if not q.is_cpu and use_triton(q, k_cache):  # CPU first: decode runs this once a layer
        return _paged_attention_triton(q, k_cache, v_cache, meta, scale, sliding_window, softcap)
    if meta.is_decode_only:  # also one sequence: CUDA graphs capture this path, not the loop
        if q.is_cpu:
            out = paged_decode_cpu(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, sliding_window,
                                   softcap, sinks)
            if out is not None:
                return out
        return paged_decode_reference(q, k_cache, v_cache, meta, scale, sliding_window, softcap, sinks)
    if q.is_cpu:
        out = paged_prefill_cpu(q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, scale,
                                sliding_window, softcap, sinks)
        if out is not None:
            return out
    return paged_attention_reference(q, k_cache, v_cache, meta, scale, sliding_window, softcap, sinks)


def _paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: "AttnMetadata",
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    if meta.is_decode_only:
        from mlxr.ops.attention.paged_decode_triton import paged_decode_triton

        return paged_decode_triton(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale, sliding_window, softcap
        )
    from mlxr.ops.attention.paged_prefill_triton import paged_prefill_triton

    return paged_prefill_triton(
        q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
        max(meta.query_lens_list), scale, sliding_window, softcap,
    )
