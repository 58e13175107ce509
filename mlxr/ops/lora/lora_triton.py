"""Triton kernels of the gathered LoRA add: each token reads its own slot's A and B.

shrink: s[t, r] = sum_k x[t, k] A[slot_t, r, k] (float32); expand: y[t, n] += sum_r s[t, r]
B[slot_t, n, r]. A token of slot -1 does nothing. One program per (token, block of outputs):
a decode batch of 64 is 64 rows, and tokens of one adapter read its matrices from cache."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _shrink(x_ptr, a_ptr, s_ptr, slots_ptr, K, R, stride_x, stride_as, stride_ar, stride_s,
            BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    rb = tl.program_id(1)
    slot = tl.load(slots_ptr + t)
    if slot >= 0:
        r = rb * BLOCK_R + tl.arange(0, BLOCK_R)
        acc = tl.zeros([BLOCK_R], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            xv = tl.load(x_ptr + t * stride_x + k, mask=k < K, other=0.0).to(tl.float32)
            av = tl.load(a_ptr + slot * stride_as + r[:, None] * stride_ar + k[None, :],
                         mask=(r[:, None] < R) & (k[None, :] < K), other=0.0).to(tl.float32)
            acc += tl.sum(av * xv[None, :], axis=1)
        tl.store(s_ptr + t * stride_s + r, acc, mask=r < R)


@triton.jit
def _expand(s_ptr, b_ptr, y_ptr, slots_ptr, N, R, stride_s, stride_bs, stride_bn, stride_y,
            BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    t = tl.program_id(0)
    nb = tl.program_id(1)
    slot = tl.load(slots_ptr + t)
    if slot >= 0:
        n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for r0 in range(0, R, BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)
            sv = tl.load(s_ptr + t * stride_s + r, mask=r < R, other=0.0)
            bv = tl.load(b_ptr + slot * stride_bs + n[:, None] * stride_bn + r[None, :],
                         mask=(n[:, None] < N) & (r[None, :] < R), other=0.0).to(tl.float32)
            acc += tl.sum(bv * sv[None, :], axis=1)
        y = tl.load(y_ptr + t * stride_y + n, mask=n < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + t * stride_y + n, (y + acc).to(y_ptr.dtype.element_ty), mask=n < N)


def lora_add_triton(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    token_slots: torch.Tensor) -> torch.Tensor:
    """y [T, N] += the gathered delta, in place; a [S, R, K], b [S, N, R] contiguous."""
    t, k = x.shape
    r, n = a.shape[1], b.shape[1]
    assert x.stride(1) == 1 and y.stride(1) == 1 and a.is_contiguous() and b.is_contiguous()
    assert token_slots.dtype in (torch.int32, torch.int64) and token_slots.numel() == t
    if t == 0:
        return y
    s = torch.empty((t, r), dtype=torch.float32, device=x.device)
    block_r = min(64, triton.next_power_of_2(r))
    _shrink[(t, triton.cdiv(r, block_r))](x, a, s, token_slots, k, r, x.stride(0), a.stride(0), a.stride(1),
                                           s.stride(0), BLOCK_R=block_r, BLOCK_K=128)
    block_n = 64
    _expand[(t, triton.cdiv(n, block_n))](s, b, y, token_slots, n, r, s.stride(0), b.stride(0), b.stride(1),
                                           y.stride(0), BLOCK_N=block_n, BLOCK_R=min(64, triton.next_power_of_2(r)))
    return y
