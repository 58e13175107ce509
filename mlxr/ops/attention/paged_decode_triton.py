"""Paged decode attention in Triton: one query token per sequence, split-K over the context.

Grid (sequence, KV head, partition). A program takes every query head of one KV head (GQA: each
K/V tile is read once for the group) over one partition of the visible context; programs past
a row's partitions exit. A row's partitions follow from its own length alone
(_context_partitions: PART_TOKENS each, longer past MAX_PARTS of them), never from the batch or
the block table's width, so a row's arithmetic is the same beside any rows: a token
verified among speculative rows gets the very output it gets decoded alone, and greedy output
with speculation stays identical to that without. (With partitions sized by the batch, a 9-row
step and a 1-row one split a 300-token context differently, and a near-tied token came out
different on an H200.) A row whose context fits one partition writes its normalised output
itself; otherwise each partition stores its running max / sum / output, merged, by the row's
own partition count, by:
- up to INLINE_MERGE_PARTS partitions: the row's last program to finish (a ticket counter), so
  no second kernel runs (at batch 1 that launch cost as much as the merge);
- more: a second kernel, one program per head, which reads the partials in chunks (the inline
  merge walks them one at a time: 2-4x slower at 32k tokens on one sequence).
Past INVARIANT_ROWS sequences whose KV heads fill the device, one partition a sequence
(plan_partitions).
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
from mlxr.ops.backend import sm_count, ticket_counters
from mlxr.ops.pdl_triton import pdl_launch, wait_for_inputs

# A partition's tokens (one bf16 tile). At batch 1 on an H200 (SmolLM2, a ~280-token context)
# 256 made plain decode 1,134 -> 1,092 tok/s: fewer programs share the context.
PART_TOKENS = 128
# A row's partitions at most (longer contexts get longer partitions): bounds the partials. Also
# the merge kernel's one padded width: a width per partition count compiled a kernel mid-serving
# for every block-table width an eager step brought (~1 s, which shifted the steps of a
# 64-request run so its greedy tokens differed from the run before it).
MAX_PARTS = 64
INLINE_MERGE_PARTS = 16  # a row of up to this many partitions is merged by its last program to finish
INVARIANT_ROWS = 16  # batch-invariant up to this many rows at least (as quant/extra_triton's GEMV)


# Neither the block tables' width nor the partition count (both change with the batch) is
# specialised on: each new case compiled another kernel, ~1 s, mid-serving.
@triton.jit(do_not_specialize=["min_part", "max_parts", "num_parts", "stride_ts"])
def _decode_partition_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, part_m_ptr, part_l_ptr, part_o_ptr, cnt_ptr,
    scale, softcap, window, min_part, max_parts, num_parts,
    stride_qs, stride_qh, stride_b, stride_t, stride_h, stride_ts, stride_os, stride_oh,
    GROUP: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr,
    PREC: tl.constexpr, UPCAST: tl.constexpr, INLINE_PARTS: tl.constexpr, PDL: tl.constexpr,
    KV_FMT: tl.constexpr,
):
    wait_for_inputs(PDL)
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    first, aligned, n_valid, part_tokens = _context_partitions(seq_len, window, min_part, max_parts, USE_WINDOW,
                                                               BLOCK_N)
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = kvh * GROUP + offs_g
    head_ok = offs_g < GROUP
    part = tl.program_id(2)
    if part < n_valid:
        q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=head_ok[:, None], other=0.0)
        o_ptrs = out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :]
        start = aligned + part * part_tokens
        m, l, acc = _attend(q, k_ptr, v_ptr, table_ptr + seq * stride_ts, start,
                            tl.minimum(start + part_tokens, seq_len), first, kvh, scale, softcap,
                            stride_b, stride_t, stride_h, G_PAD, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
                            USE_SOFTCAP, PREC, UPCAST, KV_FMT)
        if n_valid == 1:
            out = acc / tl.where(l > 0, l, 1.0)[:, None]
            tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=head_ok[:, None])
        else:  # unnormalised partials, merged below or by the reduce kernel
            base = (seq * tl.num_programs(1) * GROUP + heads) * num_parts
            tl.store(part_m_ptr + base + part, m, mask=head_ok)
            tl.store(part_l_ptr + base + part, l, mask=head_ok)
            tl.store(part_o_ptr + (base + part)[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=head_ok[:, None])
            if n_valid <= INLINE_PARTS:
                tl.debug_barrier()  # every thread's partials are written before the release below
                counter = cnt_ptr + seq * tl.num_programs(1) + kvh
                if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == n_valid - 1:  # the last to finish
                    out = _merge_partitions(part_m_ptr, part_l_ptr, part_o_ptr, base, n_valid, head_ok, offs_d,
                                            G_PAD, HEAD_DIM)
                    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=head_ok[:, None])
                    tl.atomic_xchg(counter, 0)  # ready for the next launch


@triton.jit
def _attend(q, k_ptr, v_ptr, table_row, start, end, first, kvh, scale, softcap, stride_b, stride_t, stride_h,
            G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
            USE_SOFTCAP: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr, KV_FMT: tl.constexpr):
    """Running max, sum and unnormalised output of q's heads over context tokens [start, end)."""
    offs_n = tl.arange(0, BLOCK_N)
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, HEAD_DIM], tl.float32)
    for t0 in range(start, end, BLOCK_N):
        t = t0 + offs_n
        valid = (t < end) & (t >= first)
        rows = gather_rows(table_row, t, t0, valid, kvh, stride_b, stride_t, stride_h, BLOCK_SIZE, BLOCK_N)
        k = load_kv_tile(k_ptr, rows, valid, q.dtype, HEAD_DIM, KV_FMT, True)
        v = load_kv_tile(v_ptr, rows, valid, q.dtype, HEAD_DIM, KV_FMT, True)
        s = scaled_scores(mma(q, tl.trans(k), PREC, UPCAST), scale, softcap, USE_SOFTCAP)
        s = tl.where(valid[None, :], s, float("-inf"))
        m, l, acc = online_softmax_step(s, m, l, acc, v, PREC, UPCAST)
    return m, l, acc


@triton.jit
def _merge_partitions(part_m_ptr, part_l_ptr, part_o_ptr, base, n_valid, head_ok, offs_d,
                      G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The normalised output of a group's heads from its n_valid partitions' partials
    (loaded past L1: other multiprocessors wrote them)."""
    m_max = tl.load(part_m_ptr + base, mask=head_ok, other=0.0, cache_modifier=".cg")
    for p in range(1, n_valid):
        m_max = tl.maximum(m_max, tl.load(part_m_ptr + base + p, mask=head_ok, other=0.0, cache_modifier=".cg"))
    acc = tl.zeros([G_PAD, HEAD_DIM], tl.float32)
    den = tl.zeros([G_PAD], tl.float32)
    for p in range(0, n_valid):
        w = tl.exp2(tl.load(part_m_ptr + base + p, mask=head_ok, other=0.0, cache_modifier=".cg") - m_max)
        den += w * tl.load(part_l_ptr + base + p, mask=head_ok, other=0.0, cache_modifier=".cg")
        o = tl.load(part_o_ptr + (base + p)[:, None] * HEAD_DIM + offs_d[None, :], mask=head_ok[:, None],
                    other=0.0, cache_modifier=".cg")
        acc += w[:, None] * o
    return acc / tl.where(den > 0, den, 1.0)[:, None]


@triton.jit
def _context_partitions(seq_len, window, min_part, max_parts, USE_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr):
    """(first visible position, the BLOCK_N-aligned start of the partitions, how many partitions
    hold context (at least 1), their tokens): min_part tokens each, longer where the visible
    context needs more than max_parts of them. From the row's own length only, never the batch."""
    first = 0
    if USE_WINDOW:
        first = tl.maximum(seq_len - window, 0)  # the oldest visible position
    # Tiles start on BLOCK_N boundaries so a tile never straddles a larger cache block.
    aligned = (first // BLOCK_N) * BLOCK_N
    part_tokens = tl.maximum(min_part, tl.cdiv(tl.cdiv(seq_len - aligned, max_parts), BLOCK_N) * BLOCK_N)
    n_valid = tl.maximum(tl.cdiv(seq_len - aligned, part_tokens), 1)  # an empty row writes zeros
    return first, aligned, n_valid, part_tokens


@triton.jit(do_not_specialize=["min_part", "max_parts", "num_parts"])
def _decode_reduce_kernel(
    part_m_ptr, part_l_ptr, part_o_ptr, out_ptr, seq_lens_ptr, window, min_part, max_parts, num_parts,
    stride_os, stride_oh,
    HEAD_DIM: tl.constexpr, P_PAD: tl.constexpr, P_CHUNK: tl.constexpr, USE_WINDOW: tl.constexpr,
    BLOCK_N: tl.constexpr, INLINE_PARTS: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    seq = tl.program_id(0)
    head = tl.program_id(1)
    n_valid = _context_partitions(tl.load(seq_lens_ptr + seq), window, min_part, max_parts, USE_WINDOW, BLOCK_N)[2]
    if n_valid > INLINE_PARTS:  # fewer: the partition kernel wrote the output itself
        offs_d = tl.arange(0, HEAD_DIM)
        base = (seq * tl.num_programs(1) + head) * num_parts
        offs_p = tl.arange(0, P_PAD)  # every partition's max in one load
        m_max = tl.max(tl.load(part_m_ptr + base + offs_p, mask=offs_p < n_valid, other=float("-inf")), 0)
        acc = tl.zeros([HEAD_DIM], tl.float32)
        den = 0.0
        # Partitions in chunks, so a [chunk, head_dim] tile bounds the registers.
        for p0 in range(0, n_valid, P_CHUNK):
            p = p0 + tl.arange(0, P_CHUNK)
            ok = p < n_valid
            w = tl.exp2(tl.load(part_m_ptr + base + p, mask=ok, other=float("-inf")) - m_max)
            l = tl.load(part_l_ptr + base + p, mask=ok, other=0.0)
            o = tl.load(part_o_ptr + (base + p)[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0)
            acc += tl.sum(w[:, None] * o, 0)
            den += tl.sum(w * l, 0)
        tl.store(out_ptr + seq * stride_os + head * stride_oh + offs_d, (acc / den).to(out_ptr.dtype.element_ty))


def plan_partitions(span: int, n_seqs: int, n_kv: int, n_sms: int, block_n: int) -> tuple[int, int, int]:
    """(min_part, max_parts, partitions) for n_seqs sequences of n_kv KV heads over `span`
    context tokens. A row is cut into partitions of min_part tokens, longer where its own context
    needs more than max_parts of them: from the row's length alone, so the same in any batch and
    any block-table width (a speculative step's rows are decoded as the plain step decodes them).
    `partitions` bounds every row's count: the grid's and the partials' size. Past INVARIANT_ROWS
    sequences whose KV heads fill the device, one partition a sequence: nothing to merge
    (merging there, batch-64 decode on an H200 ran 22,839-23,253 tok/s against 24,152 without:
    spec_decode-20261129T0038*Z, -004345Z); no step that speculates is that large, and products
    of that many rows are not batch-invariant anyway. (Engine tok/s of trees that round
    differently is no kernel timing at batch 64: requests stop at EOS at other points and the
    small-batch tail changes. With fixed work, `--ignore-eos`, this kernel and 53fa2a1's ran
    30.6-32.7k and 31.0-33.2k tok/s, spec_decode-20261129T0344*Z-0345*Z; alone, 9.0 against 9.9 us a
    64 x 400-token launch and 6.4 against 4.9 us at one 300-token row, attn_ab-20261129T0335Z.)"""
    if n_seqs > INVARIANT_ROWS and n_seqs * n_kv >= n_sms:
        whole = -(-span // block_n) * block_n
        return whole, 1, 1
    return PART_TOKENS, MAX_PARTS, min(MAX_PARTS, -(-span // PART_TOKENS))


def default_block_n(head_dim: int, dtype: torch.dtype) -> int:
    if dtype == torch.float32:  # twice the bytes a tile: the smaller tiles keep shared memory in bounds
        return 32 if head_dim >= 256 else 64
    # Measured on an H200 (bench/kernels/kernels.py --only sweep): 128 beats 64 by 10-20% up to d=128.
    return 64 if head_dim >= 256 else 128


def paged_decode_triton(
    q: torch.Tensor,  # [S, H, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [S, max_blocks]
    seq_lens: torch.Tensor,  # [S]
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    part_tokens: int | None = None,
    block_n: int | None = None,
    out: torch.Tensor | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Launcher. Grid sizes come from tensor shapes only (no host copy of the lengths), so a
    CUDA graph captured once replays for any lengths that fit the block table. part_tokens
    (every row in partitions of that many tokens), block_n and the launch knobs override the
    defaults (tests, tuning)."""
    kv_fmt = check_cache(k_cache, v_cache, q)
    n_seqs, n_heads, dim = q.shape
    _, block_size, n_kv, _ = k_cache.shape
    assert block_tables.dim() == 2 and block_tables.shape[0] == n_seqs and block_tables.stride(1) == 1
    assert seq_lens.shape == (n_seqs,) and not block_tables.dtype.is_floating_point
    block_n = block_n or default_block_n(dim, q.dtype)
    span = block_tables.shape[1] * block_size
    if sliding_window is not None:
        span = min(span, sliding_window + block_n)  # + alignment of the window's first tile
    if n_seqs == 0:
        return torch.empty_like(q) if out is None else out
    if part_tokens is None:
        min_part, max_parts, parts = plan_partitions(span, n_seqs, n_kv, sm_count(q.device), block_n)
    else:  # every row in partitions of part_tokens
        assert part_tokens % block_n == 0
        min_part, parts = part_tokens, -(-span // part_tokens)
        max_parts = parts
    out = torch.empty_like(q) if out is None else out
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride(-1) == 1
    group = n_heads // n_kv
    split = parts > 1
    f32 = dict(dtype=torch.float32, device=q.device)
    part_m = torch.empty((n_seqs, n_heads, parts) if split else (1,), **f32)
    part_l = torch.empty_like(part_m)
    part_o = torch.empty((n_seqs, n_heads, parts, dim) if split else (1,), **f32)
    counters = ticket_counters(q.device, n_seqs * n_kv)
    prec, upcast = dot_flags(q.dtype)
    _decode_partition_kernel[(n_seqs, n_kv, parts)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_m, part_l, part_o, counters,
        scale, softcap or 0.0, sliding_window or 0, min_part, max_parts, parts,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, G_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n,
        USE_WINDOW=sliding_window is not None, USE_SOFTCAP=softcap is not None,
        PREC=prec, UPCAST=upcast, INLINE_PARTS=INLINE_MERGE_PARTS, KV_FMT=kv_fmt,
        num_warps=num_warps, num_stages=num_stages, **pdl_launch(q.device),
    )
    if parts > INLINE_MERGE_PARTS:  # some row may have more partitions than the inline merge takes
        _decode_reduce_kernel[(n_seqs, n_heads)](
            part_m, part_l, part_o, out, seq_lens, sliding_window or 0, min_part, max_parts, parts,
            out.stride(0), out.stride(1), HEAD_DIM=dim, P_PAD=max(MAX_PARTS, triton.next_power_of_2(parts)), P_CHUNK=16,
            USE_WINDOW=sliding_window is not None,
            BLOCK_N=block_n, INLINE_PARTS=INLINE_MERGE_PARTS, num_warps=4, **pdl_launch(q.device),
        )
    return out
