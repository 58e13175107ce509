"""The C attention kernels (mlxr/ops/attention/attention.c) against the torch references."""
from __future__ import annotations

import pytest
import torch

from mlxr.ops.attention import attention_cpu
from mlxr.ops.attention.paged_attention import paged_attention, paged_attention_reference, paged_decode_reference
from mlxr.ops.rotary.rotary import rotary_reference, rotary_write_kv_query
from test_paged_attention import build

pytestmark = pytest.mark.skipif(attention_cpu._library() is None, reason="no C compiler")


@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (8, 2), (4, 1)])
@pytest.mark.parametrize("window,softcap", [(None, None), (5, None), (None, 30.0)])
@pytest.mark.parametrize("block_size", [1, 16])
def test_decode_kernel_matches_reference(n_heads, n_kv, window, softcap, block_size):
    q, kc, vc, meta, _, _ = build([1, 1, 1], [9, 1, 40], n_heads, n_kv, 64, block_size)
    kc, vc = kc.nan_to_num(0.0), vc.nan_to_num(0.0)  # the reference multiplies unused slots by 0
    want = paged_decode_reference(q, kc, vc, meta, 0.125, window, softcap)
    with torch.inference_mode():
        got = paged_attention(q, kc, vc, meta, 0.125, window, softcap)
        direct = attention_cpu.paged_decode_cpu(q, kc, vc, meta.block_tables, meta.seq_lens, 0.125, window, softcap)
    assert direct is not None
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(direct, want, rtol=1e-5, atol=1e-5)


def test_decode_kernel_is_skipped_outside_inference_mode():
    q, kc, vc, meta, _, _ = build([1], [5], 4, 2, 32, 4)
    assert attention_cpu.paged_decode_cpu(q, kc, vc, meta.block_tables, meta.seq_lens, 1.0, None, None) is None


@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (8, 2), (4, 1)])
@pytest.mark.parametrize("window,softcap", [(None, None), (5, None), (None, 30.0)])
@pytest.mark.parametrize("block_size,dim", [(1, 64), (16, 64), (16, 32), (4, 128)])
def test_prefill_kernel_matches_reference(n_heads, n_kv, window, softcap, block_size, dim):
    # A fresh prompt, a decode row, a chunk after a cached prefix, a one-token prompt.
    q, kc, vc, meta, _, _ = build([7, 1, 3, 1], [7, 12, 20, 1], n_heads, n_kv, dim, block_size)
    kc, vc = kc.nan_to_num(0.0), vc.nan_to_num(0.0)
    want = paged_attention_reference(q, kc, vc, meta, 0.125, window, softcap)
    with torch.inference_mode():
        got = paged_attention(q, kc, vc, meta, 0.125, window, softcap)
        direct = attention_cpu.paged_prefill_cpu(q, kc, vc, meta.block_tables, meta.query_start_loc, meta.seq_lens,
                                                 0.125, window, softcap)
    assert direct is not None and torch.equal(got, direct)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_prompts_tokens_get_the_bits_their_decode_steps_would():
    """Prefill runs the decode kernel's arithmetic a token at a time: the attention of a prompt's
    token equals a decode step's at that position, bit for bit (chunking cannot change a token)."""
    q, kc, vc, meta, _, _ = build([24], [24], 8, 2, 64, 16)
    with torch.inference_mode():
        prompt = attention_cpu.paged_prefill_cpu(q, kc, vc, meta.block_tables, meta.query_start_loc,
                                                 meta.seq_lens, 0.125, None, None)
        for pos in (0, 9, 23):
            step = attention_cpu.paged_decode_cpu(q[pos : pos + 1].contiguous(), kc, vc, meta.block_tables,
                                                  torch.tensor([pos + 1]), 0.125, None, None)
            assert torch.equal(prompt[pos], step[0])


def test_prefill_kernel_is_skipped_outside_inference_mode():
    q, kc, vc, meta, _, _ = build([3], [5], 4, 2, 32, 4)
    assert attention_cpu.paged_prefill_cpu(q, kc, vc, meta.block_tables, meta.query_start_loc, meta.seq_lens,
                                           1.0, None, None) is None


@pytest.mark.parametrize("split", [False, True])
def test_rotary_cache_write_matches_reference(split):
    t, h, kh, d = 5, 4, 2, 64
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(t, (h + 2 * kh) * d, generator=g)
    q, k, v = qkv.split([h * d, kh * d, kh * d], dim=-1)
    q, k, v = q.view(t, h, d), k.view(t, kh, d), v.view(t, kh, d)
    if not split:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    pos = torch.tensor([0, 3, 7, 100, 4000])
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    slots = torch.tensor([9, 2, 0, 5, 11])
    kc, vc = torch.zeros(3, 4, kh, d), torch.zeros(3, 4, kh, d)
    with torch.inference_mode():
        got_q = rotary_write_kv_query(q, k, v, pos, inv, kc, vc, slots)
    want_q, want_k = rotary_reference(q, k, pos, inv)
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc.view(12, kh, d)[slots], want_k, rtol=1e-5, atol=1e-5)
    assert torch.equal(vc.view(12, kh, d)[slots], v)


@pytest.mark.parametrize("n_heads,n_kv", [(8, 2), (4, 4)])
@pytest.mark.parametrize("window", [None, 5])
def test_the_kernels_take_attention_sinks_as_the_references_do(n_heads, n_kv, window):
    sinks = torch.linspace(-2.0, 3.0, n_heads)
    q, kc, vc, meta, _, _ = build([7, 1, 3, 1], [7, 12, 20, 1], n_heads, n_kv, 64, 16)
    kc, vc = kc.nan_to_num(0.0), vc.nan_to_num(0.0)
    dq, dkc, dvc, dmeta, _, _ = build([1, 1, 1], [9, 1, 40], n_heads, n_kv, 64, 4)
    dkc, dvc = dkc.nan_to_num(0.0), dvc.nan_to_num(0.0)
    with torch.inference_mode():
        prefill = attention_cpu.paged_prefill_cpu(q, kc, vc, meta.block_tables, meta.query_start_loc, meta.seq_lens,
                                                  0.125, window, None, sinks)
        decode = attention_cpu.paged_decode_cpu(dq, dkc, dvc, dmeta.block_tables, dmeta.seq_lens, 0.125, window, None,
                                                sinks)
    assert prefill is not None and decode is not None
    torch.testing.assert_close(prefill, paged_attention_reference(q, kc, vc, meta, 0.125, window, None, sinks),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(decode, paged_decode_reference(dq, dkc, dvc, dmeta, 0.125, window, None, sinks),
                               rtol=1e-5, atol=1e-5)
    plain = paged_attention_reference(q, kc, vc, meta, 0.125, window, None)
    assert (prefill - plain).abs().max() > 1e-2  # the sinks change the output
