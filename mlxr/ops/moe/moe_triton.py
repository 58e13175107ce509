"""Fused mixture-of-experts MLP in Triton: (token, expert) pairs grouped by expert in blocks of
BLOCK_M rows, then two grouped GEMMs, act(x Wg^T) * (x Wu^T) and (h Wd^T) * routing weight.

The grouping (`align_by_expert`) uses only device-side torch ops with a size bound fixed by the
token count (N pairs + E * (BLOCK_M - 1) padding rows), so no host sync happens and CUDA graphs
can capture it. Padding rows hold the sentinel N and blocks past the last expert's hold E; the
kernels skip both.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlxr.ops.attention.attention_tiles_triton import dot_flags, mma


def align_by_expert(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pair ids [N + E*(BM-1), rounded up to BM] grouped by expert, each expert's run padded to BM with N;
    the expert of each BM block, E for blocks past the end) for top-k ids [T, k]."""
    flat = ids.reshape(-1)
    n = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    rank = torch.arange(n, device=ids.device) - (torch.cumsum(counts, 0) - counts)[expert_of]
    capacity = (n + num_experts * (block_m - 1) + block_m - 1) // block_m * block_m  # whole blocks
    sorted_ids = torch.full((capacity,), n, dtype=torch.int64, device=ids.device)
    sorted_ids[(padded_end - padded)[expert_of] + rank] = order
    block_starts = torch.arange(0, capacity, block_m, device=ids.device)
    block_expert = torch.searchsorted(padded_end, block_starts, right=True)  # E past the end
    return sorted_ids, block_expert


@triton.jit
def _gate_up_kernel(x_ptr, wg_ptr, wu_ptr, h_ptr, sorted_ptr, block_expert_ptr,
                    n_pairs, top_k, hidden, inter, E,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    PREC: tl.constexpr, UPCAST: tl.constexpr):
    block, col_block = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + block)
    if expert < E:
        pairs = tl.load(sorted_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = pairs < n_pairs
        tokens = tl.where(valid, pairs // top_k, 0)
        cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < inter
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        w_base = expert.to(tl.int64) * inter * hidden
        for k0 in range(0, hidden, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < hidden
            x = tl.load(x_ptr + tokens[:, None] * hidden + ks[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
            w_off = w_base + cols[None, :] * hidden + ks[:, None]  # [BK, BN]: W^T tile
            w_ok = k_ok[:, None] & col_ok[None, :]
            acc_g += mma(x, tl.load(wg_ptr + w_off, mask=w_ok, other=0.0), PREC, UPCAST)
            acc_u += mma(x, tl.load(wu_ptr + w_off, mask=w_ok, other=0.0), PREC, UPCAST)
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u  # silu(gate) * up
        tl.store(h_ptr + pairs[:, None] * inter + cols[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=valid[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(h_ptr, wd_ptr, route_w_ptr, out_ptr, sorted_ptr, block_expert_ptr,
                 n_pairs, hidden, inter, E,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PREC: tl.constexpr, UPCAST: tl.constexpr):
    block, col_block = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + block)
    if expert < E:
        pairs = tl.load(sorted_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = pairs < n_pairs
        safe = tl.where(valid, pairs, 0)
        cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < hidden
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        w_base = expert.to(tl.int64) * hidden * inter
        for k0 in range(0, inter, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < inter
            h = tl.load(h_ptr + safe[:, None] * inter + ks[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(wd_ptr + w_base + cols[None, :] * inter + ks[:, None],
                        mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc += mma(h, w, PREC, UPCAST)
        acc *= tl.load(route_w_ptr + safe, mask=valid, other=0.0).to(tl.float32)[:, None]
        tl.store(out_ptr + pairs[:, None] * hidden + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=valid[:, None] & col_ok[None, :])


def fused_moe_silu(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor,
                   weights: torch.Tensor, ids: torch.Tensor, block_m: int = 16, block_n: int = 32,
                   block_k: int = 32) -> torch.Tensor:
    """sum_j weights[t, j] * down(silu(gate(x_t)) * up(x_t)) over the experts ids[t, j].
    x [T, H]; gate_w, up_w [E, I, H]; down_w [E, H, I]; weights, ids [T, k]."""
    t, hidden = x.shape
    n_experts, inter, _ = gate_w.shape
    top_k = ids.shape[1]
    n_pairs = t * top_k
    x, gate_w, up_w, down_w = x.contiguous(), gate_w.contiguous(), up_w.contiguous(), down_w.contiguous()
    sorted_ids, block_expert = align_by_expert(ids, n_experts, block_m)
    prec, upcast = dot_flags(x.dtype)
    h = torch.empty(n_pairs, inter, dtype=x.dtype, device=x.device)
    grid = (block_expert.numel(), triton.cdiv(inter, block_n))
    _gate_up_kernel[grid](x, gate_w, up_w, h, sorted_ids, block_expert, n_pairs, top_k, hidden, inter,
                          n_experts, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PREC=prec, UPCAST=upcast)
    out = torch.empty(n_pairs, hidden, dtype=x.dtype, device=x.device)
    grid = (block_expert.numel(), triton.cdiv(hidden, block_n))
    _down_kernel[grid](h, down_w, weights.reshape(-1).contiguous(), out, sorted_ids, block_expert,
                       n_pairs, hidden, inter, n_experts, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                       PREC=prec, UPCAST=upcast)
    return out.view(t, top_k, hidden).sum(1)
