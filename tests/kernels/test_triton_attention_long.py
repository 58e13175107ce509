"""Triton paged attention against plain torch softmax attention (fp32) at lengths that are not
multiples of its tiles, and on CUDA at long prompts: 8k and 32k tokens, where a materialised
n x n score matrix could not fit (the peak memory is checked), and split decode at 32k."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels' modules are imported
pytest.importorskip("triton")

from mlxr.ops.attention.paged_decode_triton import paged_decode_triton  # noqa: E402
from mlxr.ops.attention.paged_prefill_triton import paged_prefill_triton  # noqa: E402
from test_attention_cpu_tiles import expected, torch_attention  # noqa: E402
from test_paged_attention import build  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="CPU interpreter grid (CUDA runs the gpu tests)")


def _prefill(q, kc, vc, meta, scale, window, **blocks):
    return paged_prefill_triton(q, kc, vc, meta.block_tables, meta.seq_lens, meta.query_start_loc,
                                max(meta.query_lens_list), scale, window, None, **blocks)


@cpu_only
@pytest.mark.parametrize("heads,dim", [((4, 4), 64), ((8, 2), 128), ((8, 1), 32)])  # GQA 1, 4, 8
@pytest.mark.parametrize("window", [None, 20])
def test_prefill_over_many_key_tiles_interpreted(heads, dim, window):
    # 16-key tiles: 37, 70 and 150 positions end mid-tile; 150 spans ten of them.
    q, kc, vc, meta, ks, vs = build([37, 1, 70], [37, 100, 150], *heads, dim, 16)
    got = _prefill(q, kc, vc, meta, 0.3, window, block_m=32, block_n=16)
    torch.testing.assert_close(got, expected(q, ks, vs, meta, 0.3, window), rtol=1e-5, atol=2e-5)


@cpu_only
@pytest.mark.parametrize("window", [None, 40])
def test_split_decode_matches_torch_softmax_interpreted(window):
    lens = [1, 33, 95, 130]
    q, kc, vc, meta, ks, vs = build([1] * len(lens), lens, 8, 2, 64, 16)
    got = paged_decode_triton(q, kc, vc, meta.block_tables, meta.seq_lens, 0.3, window, part_tokens=32, block_n=16)
    torch.testing.assert_close(got, expected(q, ks, vs, meta, 0.3, window), rtol=1e-5, atol=2e-5)


def _long_cache(n, n_heads, n_kv, dim, dtype, block_size=16):
    """One sequence of n cached tokens on CUDA in scattered blocks; q for all n positions."""
    g = torch.Generator(device="cuda").manual_seed(0)
    n_blocks = -(-n // block_size)
    kc = torch.randn(n_blocks, block_size, n_kv, dim, generator=g, device="cuda", dtype=dtype)
    vc = torch.randn_like(kc)
    table = torch.randperm(n_blocks, generator=g, device="cuda")[None]
    q = torch.randn(n, n_heads, dim, generator=g, device="cuda", dtype=dtype)
    return q, kc, vc, table


def _rows_reference(q, kc, vc, table, positions, scale, window):
    """fp32 softmax attention of the query rows at `positions` over their causal prefix."""
    n_blocks, bs, n_kv, dim = kc.shape
    k = kc[table[0]].reshape(-1, n_kv, dim).float()
    v = vc[table[0]].reshape(-1, n_kv, dim).float()
    return torch.stack([torch_attention(q[p : p + 1].float(), k[: p + 1], v[: p + 1], scale, window)[0]
                        for p in positions])


@pytest.mark.gpu
@pytest.mark.parametrize("n", [8192, 32768])
@pytest.mark.parametrize("heads,dim,window", [((9, 3), 64, None), ((4, 1), 256, 512), ((32, 8), 128, None)])
def test_long_prefill_gpu(n, heads, dim, window):
    """A whole long prompt in one launch: sampled rows against fp32 softmax, and no more memory
    than the output (an n x n fp32 score matrix of one head is 256 MiB at 8k, 4 GiB at 32k)."""
    q, kc, vc, table = _long_cache(n, *heads, dim, torch.bfloat16)
    seq_lens = torch.tensor([n], device="cuda")
    starts = torch.tensor([0, n], device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = paged_prefill_triton(q, kc, vc, table, seq_lens, starts, n, dim**-0.5, window)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base <= 2 * out.numel() * out.element_size()
    positions = [0, 1, 511, 512, 4097, n - 2, n - 1]
    want = _rows_reference(q, kc, vc, table, positions, dim**-0.5, window)
    err = (out[positions].float() - want).norm() / want.norm()
    assert err < 1.5e-2, err


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16])
def test_split_decode_at_32k_gpu(batch):
    n, heads, dim = 32768, (9, 3), 64
    q, kc, vc, table = _long_cache(n, *heads, dim, torch.bfloat16)
    lens = torch.tensor([n - 37 * i for i in range(batch)], device="cuda")
    rows = q[-batch:].contiguous()
    out = paged_decode_triton(rows, kc, vc, table.expand(batch, -1).contiguous(), lens, dim**-0.5)
    k = kc[table[0]].reshape(-1, heads[1], dim).float()
    v = vc[table[0]].reshape(-1, heads[1], dim).float()
    for r in range(batch):
        m = int(lens[r])
        want = torch_attention(rows[r : r + 1].float(), k[:m], v[:m], dim**-0.5, None)[0]
        err = (out[r].float() - want).norm() / want.norm()
        assert err < 1.5e-2, (r, err)
