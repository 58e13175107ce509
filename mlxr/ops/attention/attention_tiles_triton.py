"""Triton building blocks shared by the paged decode and prefill attention kernels."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlxr.ops.attention.kv_quant import kv_format, row_width
from mlxr.ops.backend import interpreting

LOG2E = 1.4426950408889634


@triton.jit
def gather_rows(
    table_row_ptr,  # this sequence's row of the block table
    t,  # [BLOCK_N] token positions
    t0,  # first position of the tile (a multiple of BLOCK_N)
    valid,  # [BLOCK_N] which positions exist
    kvh,
    stride_b,
    stride_t,
    stride_h,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Element offsets of each token's K/V row (head kvh) in the paged cache."""
    if BLOCK_SIZE >= BLOCK_N:
        # The whole tile lies in one cache block: one block id, contiguous rows.
        blk = tl.load(table_row_ptr + t0 // BLOCK_SIZE).to(tl.int64)
    else:
        blk = tl.load(table_row_ptr + t // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    return blk * stride_b + (t % BLOCK_SIZE) * stride_t + kvh * stride_h


# KV_FMT of the kernels: a float cache (loaded, then cast to the queries' dtype), or a packed one
# (kv_quant.py: blocks of 32 values behind a little-endian fp16 scale), dequantized in registers.
KV_FLOAT, KV_Q8_0, KV_Q4_0, KV_FP8 = 0, 3, 4, 5


@triton.jit
def _byte(ptr, offs, mask):
    return tl.load(ptr + offs, mask=mask, other=0).to(tl.int32) & 255


@triton.jit
def load_kv_tile(ptr, rows, valid, dtype: tl.constexpr, HEAD_DIM: tl.constexpr, KV_FMT: tl.constexpr,
                 MASKED: tl.constexpr):
    """The [BLOCK_N, HEAD_DIM] K or V tile at row offsets `rows` (elements of the cache tensor:
    bytes for a packed one), as dtype; rows not `valid` read 0 where MASKED."""
    offs_d = tl.arange(0, HEAD_DIM)
    mask = valid[:, None] & (offs_d[None, :] < HEAD_DIM)
    if KV_FMT == 0:
        if MASKED:
            x = tl.load(ptr + rows[:, None] + offs_d[None, :], mask=mask, other=0.0)
        else:
            x = tl.load(ptr + rows[:, None] + offs_d[None, :])
        return x.to(dtype)
    within = offs_d % 32
    if KV_FMT == 4:
        base = rows[:, None] + (offs_d // 32 * 18)[None, :]
    else:
        base = rows[:, None] + (offs_d // 32 * 34)[None, :]
    bits = _byte(ptr, base, mask) | (_byte(ptr, base + 1, mask) << 8)
    scale = bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    if KV_FMT == 3:
        code = tl.load(ptr + base + 2 + within[None, :], mask=mask, other=0).to(tl.float32)
    elif KV_FMT == 4:
        b = _byte(ptr, base + 2 + (within % 16)[None, :], mask)
        code = (tl.where(within[None, :] < 16, b & 15, b >> 4) - 8).to(tl.float32)
    else:  # e4m3: exponent bias 7, subnormals m x 2^-9; no NaN is ever stored
        b = _byte(ptr, base + 2 + within[None, :], mask)
        mag = b & 127
        normal = ((mag << 20) + (120 << 23)).to(tl.float32, bitcast=True)
        code = tl.where(mag < 8, mag.to(tl.float32) * 0.001953125, normal)
        code = tl.where(b >= 128, -code, code)
    return (code * scale).to(dtype)


@triton.jit
def mma(a, b, PREC: tl.constexpr, UPCAST: tl.constexpr):
    # The CPU interpreter multiplies bf16 as raw integers; fp32 operands hold the same values.
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def scaled_scores(s, scale, softcap, USE_SOFTCAP: tl.constexpr):
    """Raw q.k scores -> base-2 logits (scaled, optionally soft-capped) for exp2."""
    s = s * scale
    if USE_SOFTCAP:
        # tanh through exp: libdevice's tanh is not available under the interpreter.
        e = tl.exp(2.0 * (s / softcap))
        s = softcap * (1.0 - 2.0 / (e + 1.0))
    return s * 1.4426950408889634


@triton.jit
def online_softmax_step(s, m, l, acc, v, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """Fold one tile of base-2 logits s [M, N] (-inf where masked) and values v [N, D]."""
    m_new = tl.maximum(m, tl.max(s, 1))
    # Rows with nothing visible yet keep m = -inf; subtract 0 so no inf - inf appears.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, PREC, UPCAST)
    return m_new, l, acc


def dot_flags(dtype: torch.dtype) -> tuple[str, bool]:
    """(input precision, upcast) for tl.dot: fp32 stays exact rather than tf32."""
    prec = "ieee" if dtype == torch.float32 else "tf32"
    return prec, interpreting() and dtype == torch.bfloat16


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, q: torch.Tensor) -> int:
    """The kernels' KV_FMT for these caches (asserting what the kernels need of them)."""
    assert k_cache.dim() == 4, "cache is [num_blocks, block_size, num_kv_heads, head_dim or packed bytes]"
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.stride(-1) == 1, "head_dim must be contiguous"
    assert k_cache.dtype == v_cache.dtype, "K and V caches share a format"
    assert q.dtype in FLOAT_DTYPES
    block_size, n_kv, width = k_cache.shape[1:]
    dim = q.shape[-1]
    assert block_size & (block_size - 1) == 0, "block_size must be a power of 2"
    assert dim & (dim - 1) == 0 and 16 <= dim <= 256, "head_dim must be a power of 2 in 16..256"
    assert q.stride(-1) == 1
    assert q.shape[-2] % n_kv == 0, "query heads must be a multiple of KV heads"
    if k_cache.dtype in FLOAT_DTYPES:
        assert width == dim
        return KV_FLOAT
    fmt = kv_format(k_cache, dim)
    assert width == row_width(fmt, dim), "a packed cache row is head_dim / 32 blocks"
    return {"q8_0": KV_Q8_0, "q4_0": KV_Q4_0, "fp8": KV_FP8}[fmt]
