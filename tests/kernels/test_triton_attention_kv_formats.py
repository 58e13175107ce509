"""The Triton paged decode and prefill kernels over packed (fp8, q8_0, q4_0) and other-dtype
caches, dequantized in registers: against the torch reference attention over the same blocks
dequantized by kv_quant.py (the CPU interpreter on tiny shapes; the `gpu` tests on CUDA).

    python -m pytest tests/kernels/test_triton_attention_kv_formats.py -m gpu   # on the GPU"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels' modules are imported
pytest.importorskip("triton")

from mlxr.ops.attention.kv_quant import dequantize_rows, quantize_rows  # noqa: E402
from mlxr.ops.attention.paged_attention import paged_attention, paged_attention_reference  # noqa: E402
from mlxr.ops.attention.paged_decode_triton import paged_decode_triton  # noqa: E402
from mlxr.ops.attention.paged_prefill_triton import paged_prefill_triton  # noqa: E402
from test_triton_attention import INTERPRETED, make, rel_err  # noqa: E402

cpu_only = pytest.mark.skipif(not INTERPRETED, reason="CPU interpreter grid (CUDA runs the gpu grid)")
PACKED = ("fp8", "q8_0", "q4_0")
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def packed(kc: torch.Tensor, vc: torch.Tensor, name: str, dtype: torch.dtype):
    """The caches in format `name` and, for the reference, those blocks dequantized to dtype."""
    out = []
    for c in (kc, vc):
        p = quantize_rows(c.float().nan_to_num(0.0), name)
        out += [p, dequantize_rows(p, name, dtype)]
    return out


def decode_case(name, lens, heads, dim, bs, window, dtype, device, softcap=None, **knobs):
    q, kc, vc, meta = make([1] * len(lens), lens, heads, dim, bs, dtype, device)
    kq, kd, vq, vd = packed(kc, vc, name, dtype)
    out = torch.full_like(q, float("nan"))
    paged_decode_triton(q, kq, vq, meta.block_tables, meta.seq_lens, 0.3, window, softcap, out=out, **knobs)
    ref = paged_attention_reference(q, kd, vd, meta, 0.3, window, softcap)
    assert rel_err(out, ref) < TOL[dtype]
    return out, (q, kd, vd, meta)


def prefill_case(name, q_lens, lens, heads, dim, bs, window, dtype, device, softcap=None, **knobs):
    q, kc, vc, meta = make(q_lens, lens, heads, dim, bs, dtype, device)
    kq, kd, vq, vd = packed(kc, vc, name, dtype)
    out = torch.full_like(q, float("nan"))
    paged_prefill_triton(q, kq, vq, meta.block_tables, meta.seq_lens, meta.query_start_loc, max(q_lens), 0.3,
                         window, softcap, out=out, **knobs)
    ref = paged_attention_reference(q, kd, vd, meta, 0.3, window, softcap)
    assert rel_err(out, ref) < TOL[dtype]
    return out, (q, kq, vq, meta)


@cpu_only
@pytest.mark.parametrize("name", PACKED)
@pytest.mark.parametrize("heads,dim,bs,window", [((8, 2), 64, 16, None), ((4, 1), 128, 4, 24)])
def test_decode_over_a_packed_cache_interpreted(name, heads, dim, bs, window):
    out, (q, kd, vd, meta) = decode_case(name, [1, 9, 70], heads, dim, bs, window, torch.float32, "cpu",
                                         part_tokens=32, block_n=16)
    # The same kernel over the dequantized float32 cache: the same arithmetic after the load.
    same = paged_decode_triton(q, kd, vd, meta.block_tables, meta.seq_lens, 0.3, window, None,
                               part_tokens=32, block_n=16)
    torch.testing.assert_close(out, same, rtol=1e-6, atol=1e-6)


@cpu_only
@pytest.mark.parametrize("name", PACKED)
@pytest.mark.parametrize("heads,dim,bs,window", [((8, 2), 64, 16, None), ((4, 4), 32, 1, 5)])
def test_prefill_over_a_packed_cache_interpreted(name, heads, dim, bs, window):
    prefill_case(name, [7, 1, 20], [7, 12, 40], heads, dim, bs, window, torch.float32, "cpu",
                 block_m=32, block_n=16)


@cpu_only
def test_a_bf16_cache_under_float32_queries_interpreted():
    """A float cache of another dtype than the queries is cast as it loads."""
    q, kc, vc, meta = make([1, 1], [9, 40], (8, 2), 64, 4, torch.float32, "cpu")
    kb, vb = kc.nan_to_num(0.0).bfloat16(), vc.nan_to_num(0.0).bfloat16()
    out = paged_decode_triton(q, kb, vb, meta.block_tables, meta.seq_lens, 0.3, block_n=16)
    ref = paged_attention_reference(q, kb.float(), vb.float(), meta, 0.3)
    assert rel_err(out, ref) < TOL[torch.float32]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", PACKED)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,dim,bs", [((32, 8), 128, 16), ((8, 1), 256, 16), ((9, 3), 64, 32)])
def test_packed_cache_kernels_on_cuda(name, dtype, heads, dim, bs):
    lens = [1, 17, 300, 4100]
    decode_case(name, lens, heads, dim, bs, None, dtype, "cuda")
    decode_case(name, lens, heads, dim, bs, 1024, dtype, "cuda", softcap=50.0)
    prefill_case(name, [1, 17, 300, 600], lens, heads, dim, bs, None, dtype, "cuda")
    # every query row has a key at or before it (a row of 5 queries over 1 key has none: NaN)
    out, (q, kq, vq, meta) = prefill_case(name, [1, 5, 1, 256], lens, heads, dim, bs, 512, dtype, "cuda")
    with torch.inference_mode():  # the dispatcher takes the packed cache to the Triton kernels too
        assert torch.equal(paged_attention(q, kq, vq, meta, 0.3, 512), out)
