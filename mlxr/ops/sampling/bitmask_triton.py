"""Structured output's token bitmask applied in one Triton kernel: logits[r, t] = -inf where bit
t % 32 of word t // 32 of row r is clear, and for every t past the mask's 32 * words."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
# One compiled variant for every call: Triton would otherwise compile one per set of integer
# arguments that are 1 or multiples of 16 and per pointer alignment, and a variant the warm-up
# did not meet compiled while serving (~40 ms of a batch-64 step on an H200;
# mask_calls-20261128T193025Z). The kernel is a memory-bound pass: specialising buys nothing.
_ANY_INT = ["vocab", "words", "stride_l", "stride_m"]
_ANY_ALIGNMENT = ["logits_ptr", "mask_ptr"]


@triton.jit(do_not_specialize=_ANY_INT, do_not_specialize_on_alignment=_ANY_ALIGNMENT)
def _bitmask_kernel(logits_ptr, mask_ptr, vocab, words, stride_l, stride_m, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = cols < vocab
    in_mask = cols < words * 32
    word = tl.load(mask_ptr + row * stride_m + cols // 32, mask=in_vocab & in_mask, other=0)
    banned = ((word >> (cols % 32)) & 1) == 0
    tl.store(logits_ptr + row * stride_l + cols, tl.full([BLOCK], float("-inf"), tl.float32),
             mask=in_vocab & banned)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: logits float32 [R, V] (last dim contiguous), bitmask int32 [R, W] on its device."""
    assert logits.dtype == torch.float32 and bitmask.dtype == torch.int32
    assert logits.shape[0] == bitmask.shape[0] and logits.stride(-1) == 1
    bitmask = bitmask.contiguous()
    rows, vocab = logits.shape
    if rows and vocab:
        grid = (rows, triton.cdiv(vocab, BLOCK))
        _bitmask_kernel[grid](logits, bitmask, vocab, bitmask.shape[1], logits.stride(0), bitmask.stride(0),
                              BLOCK=BLOCK)
