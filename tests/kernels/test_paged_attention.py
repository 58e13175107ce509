"""The torch reference paged attention against a float64 dense ground truth."""
from __future__ import annotations

import pytest
import torch

from mlxr.ops.attention.attn_metadata import AttnMetadata
from mlxr.ops.attention.paged_attention import (paged_attention, paged_attention_reference, paged_decode_reference,
                                               write_kv)


def dense(q, k, v, scale, window):
    """Causal softmax attention of q [q_len, H, D] over k/v [L, KH, D] in float64."""
    q_len, n_heads, _ = q.shape
    seq_len, n_kv, _ = k.shape
    k = k.double().repeat_interleave(n_heads // n_kv, 1)
    v = v.double().repeat_interleave(n_heads // n_kv, 1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    qp = torch.arange(seq_len - q_len, seq_len)[:, None]
    kp = torch.arange(seq_len)[None]
    mask = (kp <= qp) & ((kp > qp - window) if window else True)
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


def build(q_lens, seq_lens, n_heads, n_kv, dim, block_size, seed=0):
    g = torch.Generator().manual_seed(seed)
    n_blocks = sum(-(-s // block_size) for s in seq_lens) + 3
    kc = torch.full((n_blocks, block_size, n_kv, dim), float("nan"))
    vc = kc.clone()
    perm = torch.randperm(n_blocks, generator=g).tolist()  # scattered blocks
    tables, ks, vs, slots = [], [], [], []
    for s in seq_lens:
        nb = -(-s // block_size)
        table = [perm.pop() for _ in range(nb)]
        tables.append(table)
        k = torch.randn(s, n_kv, dim, generator=g)
        v = torch.randn(s, n_kv, dim, generator=g)
        ks.append(k)
        vs.append(v)
        slots += [table[p // block_size] * block_size + p % block_size for p in range(s)]
    write_kv(torch.cat(ks), torch.cat(vs), kc, vc, torch.tensor(slots))
    width = max(len(t) for t in tables)
    meta = AttnMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        query_start_loc=torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist()),
        seq_lens=torch.tensor(seq_lens),
        query_lens_list=list(q_lens),
        seq_lens_list=list(seq_lens),
        block_size=block_size,
    )
    q = torch.randn(sum(q_lens), n_heads, dim, generator=g)
    return q, kc, vc, meta, ks, vs


@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_prefill_and_decode_match_dense_float64(n_heads, n_kv, window, block_size):
    q_lens, seq_lens = [7, 1, 3, 1], [7, 12, 20, 1]  # fresh prefill, decode, chunk on a prefix
    q, kc, vc, meta, ks, vs = build(q_lens, seq_lens, n_heads, n_kv, 16, block_size)
    out = paged_attention(q, kc, vc, meta, 0.25, window)
    start = 0
    for ql, k, v in zip(q_lens, ks, vs):
        want = dense(q[start : start + ql], k, v, 0.25, window)
        torch.testing.assert_close(out[start : start + ql].double(), want, atol=1e-5, rtol=1e-5)
        start += ql


@pytest.mark.parametrize("window", [None, 3])
def test_batched_decode_equals_per_sequence_reference(window):
    seq_lens = [1, 5, 17, 33]
    q, kc, vc, meta, _, _ = build([1] * 4, seq_lens, 8, 2, 16, 4)
    # The padded table entries point at real (NaN-free) blocks; masked positions never leak.
    batched = paged_decode_reference(q, kc.nan_to_num(), vc.nan_to_num(), meta, 0.3, window)
    looped = paged_attention_reference(q, kc.nan_to_num(), vc.nan_to_num(), meta, 0.3, window)
    torch.testing.assert_close(batched, looped, atol=1e-6, rtol=1e-6)


def dense_with_sinks(q, k, v, scale, window, sinks):
    """As dense, each head's softmax also counting its sink logit (whose weight is dropped)."""
    out = dense(q, k, v, scale, window)  # softmax over the keys alone, then renormalised
    q_len, n_heads, _ = q.shape
    k64 = k.double().repeat_interleave(n_heads // k.shape[1], 1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k64) * scale
    qp, kp = torch.arange(k.shape[0] - q_len, k.shape[0])[:, None], torch.arange(k.shape[0])[None]
    mask = (kp <= qp) & ((kp > qp - window) if window else True)
    lse = s.masked_fill(~mask, float("-inf")).logsumexp(-1)  # [H, q]
    keep = torch.sigmoid(lse - sinks.double()[:, None])  # Z / (Z + e^sink)
    return out * keep.T[..., None]


@pytest.mark.parametrize("window", [None, 5])
def test_sinks_match_dense_float64_in_prefill_and_batched_decode(window):
    sinks = torch.tensor([-1.0, 0.5, 2.0, 4.0, 0.0, 1.0, -3.0, 3.0])
    q_lens, seq_lens = [7, 1, 3, 1], [7, 12, 20, 1]
    q, kc, vc, meta, ks, vs = build(q_lens, seq_lens, 8, 2, 16, 4)
    out = paged_attention(q, kc, vc, meta, 0.25, window, sinks=sinks)
    start = 0
    for ql, k, v in zip(q_lens, ks, vs):
        want = dense_with_sinks(q[start : start + ql], k, v, 0.25, window, sinks)
        torch.testing.assert_close(out[start : start + ql].double(), want, atol=1e-5, rtol=1e-5)
        start += ql
    dq, dkc, dvc, dmeta, dks, dvs = build([1] * 3, [1, 9, 30], 8, 2, 16, 4)
    decoded = paged_attention(dq, dkc.nan_to_num(), dvc.nan_to_num(), dmeta, 0.25, window, sinks=sinks)
    for i, (k, v) in enumerate(zip(dks, dvs)):
        torch.testing.assert_close(decoded[i:i + 1].double(), dense_with_sinks(dq[i:i + 1], k, v, 0.25, window, sinks),
                                   atol=1e-5, rtol=1e-5)
