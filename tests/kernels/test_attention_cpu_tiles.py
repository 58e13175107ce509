"""The tiled C attention (attention_tiles.h: 64-position K/V tiles, 512-position partitions)
against plain torch softmax attention in float32, at lengths on and off the tile and partition
boundaries, with and without sliding windows, GQA ratios 1/4/8 and head dims 64/128/256."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mlxr.ops.attention import attention_cpu
from test_paged_attention import build

pytestmark = pytest.mark.skipif(attention_cpu._library() is None, reason="no C compiler")


def torch_attention(q, k, v, scale, window, softcap=None):
    """q [Q, H, D] at the last Q positions of k/v [L, KH, D]: causal softmax attention, fp32."""
    q_len, n_heads, _ = q.shape
    seq_len, n_kv, _ = k.shape
    k = k.repeat_interleave(n_heads // n_kv, 1)
    v = v.repeat_interleave(n_heads // n_kv, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    qp = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
    kp = torch.arange(seq_len, device=q.device)[None]
    mask = kp <= qp
    if window:
        mask &= kp > qp - window
    return torch.einsum("hqk,khd->qhd", F.softmax(s.masked_fill(~mask, float("-inf")), -1), v)


def expected(q, ks, vs, meta, scale, window, softcap=None):
    out, start = [], 0
    for k, v, q_len in zip(ks, vs, meta.query_lens_list):
        out.append(torch_attention(q[start : start + q_len], k, v, scale, window, softcap))
        start += q_len
    return torch.cat(out)


def prefill(q, kc, vc, meta, scale, window, softcap=None):
    with torch.inference_mode():
        got = attention_cpu.paged_prefill_cpu(q, kc, vc, meta.block_tables, meta.query_start_loc, meta.seq_lens,
                                              scale, window, softcap)
    assert got is not None
    return got


def decode(q, kc, vc, meta, scale, window, softcap=None):
    with torch.inference_mode():
        got = attention_cpu.paged_decode_cpu(q, kc, vc, meta.block_tables, meta.seq_lens, scale, window, softcap)
    assert got is not None
    return got


# Lengths: under a tile, one tile, just past it, past a partition (512), several partitions.
@pytest.mark.parametrize("q_lens,seq_lens", [([1], [1]), ([63], [63]), ([65], [65]), ([200], [513]),
                                             ([700], [1100]), ([130, 1, 77], [130, 600, 590])])
@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (8, 2), (8, 1)])  # GQA 1, 4, 8
@pytest.mark.parametrize("window", [None, 100, 600])
def test_prefill_tiles_match_torch_softmax(q_lens, seq_lens, n_heads, n_kv, window):
    q, kc, vc, meta, ks, vs = build(q_lens, seq_lens, n_heads, n_kv, 64, 16)
    torch.testing.assert_close(prefill(q, kc, vc, meta, 0.125, window), expected(q, ks, vs, meta, 0.125, window),
                               rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("dim,n_heads,n_kv", [(128, 8, 2), (256, 4, 1), (32, 4, 2), (48, 3, 1)])
@pytest.mark.parametrize("window,softcap", [(None, None), (300, None), (None, 50.0)])
def test_prefill_tiles_match_torch_softmax_at_other_head_dims(dim, n_heads, n_kv, window, softcap):
    # 48: not a multiple of 16, the portable tiles; Gemma 3 uses 256 with its 512 window.
    q, kc, vc, meta, ks, vs = build([300, 5], [700, 520], n_heads, n_kv, dim, 16)
    scale = dim**-0.5
    torch.testing.assert_close(prefill(q, kc, vc, meta, scale, window, softcap),
                               expected(q, ks, vs, meta, scale, window, softcap), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("n_heads,n_kv,dim", [(9, 3, 64), (8, 1, 128), (4, 1, 256)])
@pytest.mark.parametrize("window", [None, 512, 700])
def test_split_decode_matches_torch_softmax(n_heads, n_kv, dim, window):
    """Contexts of one to several partitions in one batch: each split, merged, equals softmax."""
    seq_lens = [1, 511, 512, 513, 1600, 2100]
    q, kc, vc, meta, ks, vs = build([1] * len(seq_lens), seq_lens, n_heads, n_kv, dim, 16)
    scale = dim**-0.5
    torch.testing.assert_close(decode(q, kc, vc, meta, scale, window), expected(q, ks, vs, meta, scale, window),
                               rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("window", [None, 300])
@pytest.mark.parametrize("dim", [64, 48])
def test_a_long_prompts_tokens_get_their_decode_steps_bits(window, dim):
    """Across tile and partition boundaries, in a block of up to 128 rows or alone, split over threads
    or not: a prompt token's attention is its decode step's, bit for bit."""
    n = 1300
    q, kc, vc, meta, _, _ = build([n], [n], 8, 2, dim, 16)
    prompt = prefill(q, kc, vc, meta, 0.125, window)
    for pos in (0, 63, 64, 511, 512, 700, 1023, 1299):
        step_meta = build([1], [pos + 1], 8, 2, dim, 16)[3]
        step_meta.block_tables = meta.block_tables
        step = decode(q[pos : pos + 1].contiguous(), kc, vc, step_meta, 0.125, window)
        assert torch.equal(prompt[pos], step[0]), pos


def test_threads_do_not_change_the_bits():
    q, kc, vc, meta, _, _ = build([1, 1, 400], [3000, 40, 900], 9, 3, 64, 16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = prefill(q, kc, vc, meta, 0.125, None), decode(q[:2].contiguous(), kc, vc, _first_two(meta), 0.125, None)
        torch.set_num_threads(2)
        two = prefill(q, kc, vc, meta, 0.125, None), decode(q[:2].contiguous(), kc, vc, _first_two(meta), 0.125, None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def _first_two(meta):
    """The decode rows (first two sequences) of a built batch."""
    two = build([1, 1], meta.seq_lens_list[:2], 9, 3, 64, 16)[3]
    two.block_tables = meta.block_tables[:2].contiguous()
    return two
