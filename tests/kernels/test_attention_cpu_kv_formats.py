"""The C paged attention kernels over bf16, fp16 and packed (fp8, q8_0, q4_0) caches: the same
bits as over the very blocks converted to a float32 cache by the torch reference's dequantizer
(kv_quant.py), and close to the torch reference attention over them."""
from __future__ import annotations

import pytest
import torch

from mlxr.ops.attention import attention_cpu
from mlxr.ops.attention.kv_quant import dequantize_rows, quantize_rows
from mlxr.ops.attention.paged_attention import paged_attention, paged_attention_reference, paged_decode_reference
from test_paged_attention import build

pytestmark = pytest.mark.skipif(attention_cpu._library() is None, reason="no C compiler")
FORMATS = ("bf16", "fp16", "fp8", "q8_0", "q4_0")


def stored(cache: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache in format `name`, and that cache's values as a float32 cache."""
    cache = cache.nan_to_num(0.0)
    if name in ("bf16", "fp16"):
        half = cache.to(torch.bfloat16 if name == "bf16" else torch.float16)
        return half, half.float()
    packed = quantize_rows(cache, name)
    return packed, dequantize_rows(packed, name)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("window,softcap", [(None, None), (5, None), (None, 30.0)])
@pytest.mark.parametrize("dim,block_size", [(64, 16), (128, 4), (32, 1)])
def test_decode_kernel_over_a_stored_cache_is_the_kernel_over_its_values(name, window, softcap, dim, block_size):
    q, kc, vc, meta, _, _ = build([1, 1, 1], [9, 1, 600], 8, 2, dim, block_size)  # 600: two partitions
    (kq, kf), (vq, vf) = stored(kc, name), stored(vc, name)
    with torch.inference_mode():
        got = attention_cpu.paged_decode_cpu(q, kq, vq, meta.block_tables, meta.seq_lens, 0.125, window, softcap)
        want = attention_cpu.paged_decode_cpu(q, kf, vf, meta.block_tables, meta.seq_lens, 0.125, window, softcap)
        assert torch.equal(paged_attention(q, kq, vq, meta, 0.125, window, softcap), got)
    assert got is not None and torch.equal(got, want)
    torch.testing.assert_close(got, paged_decode_reference(q, kq, vq, meta, 0.125, window, softcap),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("window,softcap", [(None, None), (5, None), (None, 30.0)])
@pytest.mark.parametrize("dim,block_size", [(64, 16), (128, 4)])
def test_prefill_kernel_over_a_stored_cache_is_the_kernel_over_its_values(name, window, softcap, dim, block_size):
    q, kc, vc, meta, _, _ = build([7, 1, 70, 1], [7, 12, 90, 1], 4, 2, dim, block_size)
    (kq, kf), (vq, vf) = stored(kc, name), stored(vc, name)
    args = (meta.block_tables, meta.query_start_loc, meta.seq_lens, 0.125, window, softcap)
    with torch.inference_mode():
        got = attention_cpu.paged_prefill_cpu(q, kq, vq, *args)
        want = attention_cpu.paged_prefill_cpu(q, kf, vf, *args)
        assert torch.equal(paged_attention(q, kq, vq, meta, 0.125, window, softcap), got)
    assert got is not None and torch.equal(got, want)
    torch.testing.assert_close(got, paged_attention_reference(q, kq, vq, meta, 0.125, window, softcap),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("rotating", [True, False])
def test_rope_write_stores_rows_as_the_torch_quantizer_does(name, rotating):
    """The C write's rows, bit for bit kv_quant.quantize_rows (or torch's cast) of the rows it
    writes to a float32 cache; values from 1e-7 to 1e4 reach every rounding path."""
    g = torch.Generator().manual_seed(3)
    t, h, kh, d = 9, 4, 2, 64
    scale = 10.0 ** torch.randint(-7, 5, (t, 1, 1), generator=g).float()
    q, k, v = (torch.randn(t, n, d, generator=g) * scale for n in (h, kh, kh))
    k[0, 0, :32] = 0.0
    v[1, 1, 3] = -7e4 if name != "fp16" else -6e4  # past fp16 only where the format scales it
    pos = torch.randint(0, 4000, (t,), generator=g)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)) if rotating else None
    slots = torch.randperm(24, generator=g)[:t]
    f32 = [torch.zeros(6, 4, kh, d) for _ in range(2)]
    ours = [stored(c, name)[0].zero_() for c in f32]
    with torch.inference_mode():
        assert attention_cpu.rope_write_kv_cpu(q, k, v, pos, inv, *f32, slots) is not None
        assert attention_cpu.rope_write_kv_cpu(q, k, v, pos, inv, *ours, slots) is not None
    for mine, floats in zip(ours, f32):
        written = floats.view(24, kh, d)[slots]
        want = written.to(mine.dtype) if name in ("bf16", "fp16") else quantize_rows(written, name)
        assert torch.equal(mine.view(24, kh, -1)[slots].view(torch.uint8), want.view(torch.uint8))
