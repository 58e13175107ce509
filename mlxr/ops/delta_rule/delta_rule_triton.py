"""The gated delta rule in Triton, fp32 (the math of delta_rule.py; layouts as dispatch.py).

The chunked scan, in the flash-linear-attention manner: one program per (head, block of value
columns) of a sequence, its [Dk, BV] slice of the state in registers across the 64-token chunks
(the state's columns never mix, so value blocks are independent). Per chunk the writes come from
the unit lower-triangular system, solved by forward substitution over the chunk's rows on the
[C, BV] tile; the products run on tl.dot in IEEE fp32 (not tf32: the tests hold it to the
reference's fp32 tolerance).

The one-step update: one program per (row, head, block of value columns), the state slice read
from and written back to the row's pool slot.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 64


@triton.jit
def _unit_rows(x, scale):
    return x * (scale / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6))[:, None]


@triton.jit
def _delta_step_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, pool_ptr, slots_ptr, lens_ptr, out_ptr,
                       q_stride, k_stride, v_stride, hv, group, dk, dv, scale,
                       BK: tl.constexpr, BV: tl.constexpr, HAS_LENS: tl.constexpr):
    task = tl.program_id(0).to(tl.int64)  # row * hv + head
    row, head = task // hv, task % hv
    cols = tl.program_id(1) * BV + tl.arange(0, BV)
    dims = tl.arange(0, BK)
    dim_ok, col_ok = dims < dk, cols < dv
    key_head = head // group
    q = tl.load(q_ptr + row * q_stride + key_head * dk + dims, mask=dim_ok, other=0.0)
    k = tl.load(k_ptr + row * k_stride + key_head * dk + dims, mask=dim_ok, other=0.0)
    q = q * (scale / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6))
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    v = tl.load(v_ptr + row * v_stride + head * dv + cols, mask=col_ok, other=0.0)
    a = tl.exp(tl.load(g_ptr + task))
    beta = tl.load(beta_ptr + task)
    slot = tl.load(slots_ptr + row)
    s_ptrs = pool_ptr + (slot * hv + head) * dk * dv + dims[:, None] * dv + cols[None, :]
    s_ok = dim_ok[:, None] & col_ok[None, :]
    s = tl.load(s_ptrs, mask=s_ok, other=0.0) * a
    if HAS_LENS:  # a row at its first token starts from zeros, whatever its slot held
        s = tl.where(tl.load(lens_ptr + row) == 1, 0.0, s)
    write = beta * (v - tl.sum(s * k[:, None], axis=0))
    s = s + k[:, None] * write[None, :]
    tl.store(s_ptrs, s, mask=s_ok)
    tl.store(out_ptr + task * dv + cols, tl.sum(s * q[:, None], axis=0), mask=col_ok)


@triton.jit
def _delta_chunked_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, out_ptr,
                          q_stride, k_stride, v_stride, t, hv, group, dk, dv, scale,
                          BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    head = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BV + tl.arange(0, BV)
    dims, steps = tl.arange(0, BK), tl.arange(0, BT)
    dim_ok, col_ok = dims < dk, cols < dv
    key_head = head // group
    s_ptrs = state_ptr + head * dk * dv + dims[:, None] * dv + cols[None, :]
    s_ok = dim_ok[:, None] & col_ok[None, :]
    s = tl.load(s_ptrs, mask=s_ok, other=0.0)
    causal = steps[:, None] >= steps[None, :]
    strict = steps[:, None] > steps[None, :]
    for start in range(0, t, BT):
        tok = start + steps
        tok_ok = tok < t
        qk_ok = tok_ok[:, None] & dim_ok[None, :]
        q = tl.load(q_ptr + tok[:, None] * q_stride + key_head * dk + dims[None, :], mask=qk_ok, other=0.0)
        k = tl.load(k_ptr + tok[:, None] * k_stride + key_head * dk + dims[None, :], mask=qk_ok, other=0.0)
        q, k = _unit_rows(q, scale), _unit_rows(k, 1.0)
        v = tl.load(v_ptr + tok[:, None] * v_stride + head * dv + cols[None, :],
                    mask=tok_ok[:, None] & col_ok[None, :], other=0.0)
        # Past the end: g = 0 keeps the running sum, beta = 0 makes the writes zero.
        c = tl.cumsum(tl.load(g_ptr + tok * hv + head, mask=tok_ok, other=0.0), axis=0)
        b = tl.load(beta_ptr + tok * hv + head, mask=tok_ok, other=0.0)
        decay = tl.where(causal, tl.exp(c[:, None] - c[None, :]), 0.0)
        lower = tl.where(strict, tl.dot(k, tl.trans(k), input_precision="ieee") * decay * b[:, None], 0.0)
        ec = tl.exp(c)
        w = b[:, None] * (v - ec[:, None] * tl.dot(k, s, input_precision="ieee"))
        for i in range(1, BT):  # forward substitution: rows before i are final
            pick = steps[:, None] == i
            a_i = tl.sum(tl.where(pick, lower, 0.0), axis=0)
            row = tl.sum(tl.where(pick, w, 0.0), axis=0) - tl.sum(a_i[:, None] * w, axis=0)
            w = tl.where(pick, row[None, :], w)
        o = ec[:, None] * tl.dot(q, s, input_precision="ieee")
        o += tl.dot(tl.dot(q, tl.trans(k), input_precision="ieee") * decay, w, input_precision="ieee")
        tl.store(out_ptr + (tok[:, None] * hv + head) * dv + cols[None, :], o, mask=tok_ok[:, None] & col_ok[None, :])
        last = tl.sum(tl.where(steps == BT - 1, c, 0.0), axis=0)
        tail = tl.exp(last - c)
        s = tl.exp(last) * s + tl.dot(tl.trans(k * tail[:, None]), w, input_precision="ieee")
    tl.store(s_ptrs, s, mask=s_ok)


def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))  # tl.dot takes sides of 16 and up


def delta_step_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      pool: torch.Tensor, slots: torch.Tensor,
                      seq_lens: torch.Tensor | None = None) -> torch.Tensor | None:
    """o [B, Hv, Dv]; pool[slots[b]] advanced in place (from zeros where seq_lens is 1). None where
    the kernel does not apply."""
    if not _fits(q, k, v, g, beta) or pool.dtype != torch.float32 or not pool.is_contiguous():
        return None
    b, hv, dv = v.shape
    dk = k.shape[2]
    slots = slots if slots.dtype == torch.int64 and slots.is_contiguous() else slots.long().contiguous()
    out = torch.empty(b, hv, dv, dtype=torch.float32, device=v.device)
    bv = min(32, _block(dv))
    if b:
        _delta_step_kernel[(b * hv, triton.cdiv(dv, bv))](
            q, k, v, g, beta, pool, slots, slots if seq_lens is None else seq_lens.contiguous(), out,
            q.stride(0), k.stride(0), v.stride(0), hv, hv // k.shape[1], dk, dv,
            dk ** -0.5, BK=_block(dk), BV=bv, HAS_LENS=seq_lens is not None, num_warps=4)
    return out


def delta_chunked_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         state: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor | None:
    """o [T, Hv, Dv]; state [Hv, Dk, Dv] advanced in place. None where the kernel does not apply."""
    if not _fits(q, k, v, g, beta) or state.dtype != torch.float32 or not state.is_contiguous():
        return None
    t, hv, dv = v.shape
    dk = k.shape[2]
    out = torch.empty(t, hv, dv, dtype=torch.float32, device=v.device)
    bv = min(32, _block(dv))
    if t:
        _delta_chunked_kernel[(hv, triton.cdiv(dv, bv))](
            q, k, v, g, beta, state, out, q.stride(0), k.stride(0), v.stride(0), t, hv, hv // k.shape[1], dk, dv,
            dk ** -0.5, BT=chunk, BK=_block(dk), BV=bv, num_warps=8 if dk > 64 else 4)
    return out


def _fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> bool:
    """fp32, a token's heads back to back, g and beta contiguous, Hv a multiple of Hk, head dims <= 256."""
    for x in (q, k, v):
        if x.dtype != torch.float32 or x.dim() != 3 or x.stride(2) != 1 or x.stride(1) != x.shape[2]:
            return False
    for x in (g, beta):
        if x.dtype != torch.float32 or not x.is_contiguous() or x.shape != v.shape[:2]:
            return False
    return q.shape == k.shape and v.shape[1] % k.shape[1] == 0 and max(k.shape[2], v.shape[2]) <= 256
