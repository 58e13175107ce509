"""The KV cache's storage formats (mlxr/ops/attention/kv_quant.py): q8_0 and q4_0 rows byte for
byte as gguf-py quantizes them, fp8 within e4m3's rounding, and paged attention over a packed
cache equal to attention over the same blocks dequantized."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from mlxr.ops.attention.kv_quant import dequantize_rows, kv_format, quantize_rows, row_width
from mlxr.ops.attention.paged_attention import paged_attention, paged_attention_reference, paged_decode_reference
from test_paged_attention import build

GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}
PACKED = ("fp8", "q8_0", "q4_0")


def rows(seed: int = 0) -> torch.Tensor:
    x = torch.randn(6, 3, 128, generator=torch.Generator().manual_seed(seed)) * 4
    x[0, 0, :32] = 0.0  # an all-zero block: scale 0
    x[1, 1, 5] = 300.0  # an outlier
    return x


@pytest.mark.parametrize("name", ["q8_0", "q4_0"])
def test_packed_rows_are_gguf_py_blocks(name):
    x = rows()
    ours = quantize_rows(x, name)
    theirs = gguf.quants.quantize(x.numpy(), GGML[name])
    assert ours.shape[-1] == row_width(name, 128) == theirs.shape[-1]
    assert np.array_equal(ours.view(torch.uint8).numpy(), theirs)
    back = dequantize_rows(ours, name)
    assert np.array_equal(back.numpy(), gguf.quants.dequantize(theirs, GGML[name]).reshape(x.shape))


def test_fp8_rows_round_each_value_to_e4m3_of_its_block_scale():
    x = rows()
    back = dequantize_rows(quantize_rows(x, "fp8"), "fp8")
    blocks, got = x.reshape(-1, 32), back.reshape(-1, 32)
    scale = (blocks.abs().amax(-1, keepdim=True) / 448).half().float()
    # e4m3 keeps 3 mantissa bits: half a step is 1/16 of the value, or of 2^-6 (its smallest normal) x scale
    bound = torch.maximum(blocks.abs() / 16, scale * 2.0 ** -10) * 1.0001
    assert ((got - blocks).abs() <= bound).all()
    assert torch.equal(got[0], torch.zeros(32))


def test_the_format_follows_from_the_cache_and_the_head_dim():
    for name in PACKED:
        assert kv_format(quantize_rows(rows(), name), 128) == name
    assert kv_format(torch.zeros(2, 128, dtype=torch.bfloat16), 128) == "bf16"


def packed_caches(kc: torch.Tensor, vc: torch.Tensor, name: str):
    """The caches packed, and the packed blocks dequantized back (what a kernel must attend over)."""
    kq, vq = quantize_rows(kc.nan_to_num(0.0), name), quantize_rows(vc.nan_to_num(0.0), name)
    return kq, vq, dequantize_rows(kq, name), dequantize_rows(vq, name)


@pytest.mark.parametrize("name", PACKED)
def test_reference_attention_over_a_packed_cache_is_attention_over_its_blocks_dequantized(name):
    q, kc, vc, meta, _, _ = build([5, 1, 3], [5, 20, 33], 8, 2, 64, 4)
    kq, vq, kd, vd = packed_caches(kc, vc, name)
    got = paged_attention_reference(q, kq, vq, meta, 0.125)
    torch.testing.assert_close(got, paged_attention_reference(q, kd, vd, meta, 0.125), rtol=0, atol=0)
    q, kc, vc, meta, _, _ = build([1, 1, 1], [9, 1, 40], 8, 2, 64, 4)
    kq, vq, kd, vd = packed_caches(kc, vc, name)
    want = paged_decode_reference(q, kd, vd, meta, 0.125)
    torch.testing.assert_close(paged_decode_reference(q, kq, vq, meta, 0.125), want, rtol=0, atol=0)
    with torch.inference_mode():
        torch.testing.assert_close(paged_attention(q, kq, vq, meta, 0.125), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", PACKED + ("bf16", "fp16"))
def test_write_kv_stores_each_token_in_the_cache_format(name):
    from mlxr.ops.attention.kv_quant import FLOATS, STORAGE
    from mlxr.ops.attention.paged_attention import write_kv

    k, v = rows(1)[:4], rows(2)[:4]
    dtype, width = (STORAGE[name], row_width(name, 128)) if name in PACKED else (FLOATS[name], 128)
    kc = torch.zeros(3, 2, 3, width, dtype=dtype)
    vc = torch.zeros_like(kc)
    write_kv(k, v, kc, vc, torch.tensor([5, 0, 2, 3]))
    want = quantize_rows(k, name) if name in PACKED else k.to(dtype)
    assert torch.equal(kc.view(6, 3, width)[[5, 0, 2, 3]], want)


def test_q4_0_layer_stores_turned_rows_and_attends_as_over_them_turned_back():
    """The layer over a q4_0 cache: K and V stored turned by the Hadamard matrix, the output
    that of attention over the stored rows turned back; with an outlier channel (as real K
    has) nearer the float cache's output than plain q4_0 rows of the same K and V."""
    from mlxr.layers.attention import PagedAttention
    from mlxr.ops.attention.kv_quant import hadamard

    q, _, _, meta, ks, vs = build([40], [40], 8, 2, 64, 16)
    k, v = ks[0].clone(), vs[0]
    k[:, :, 3] *= 30.0  # an outlier channel
    shape = (6, 16, 2, row_width("q4_0", 64))
    kc, vc = torch.zeros(shape, dtype=torch.uint8), torch.zeros(shape, dtype=torch.uint8)
    layer = PagedAttention(8, 2, 64, 0.125)
    with torch.inference_mode():
        got = layer(q, k, v, (kc, vc), meta)
        h = hadamard(64, torch.float32, q.device)
        turned_back = [dequantize_rows(c, "q4_0") @ h for c in (kc, vc)]
        want = paged_attention_reference(q, *turned_back, meta, 0.125)
        fk, fv = torch.zeros(6, 16, 2, 64), torch.zeros(6, 16, 2, 64)
        exact = PagedAttention(8, 2, 64, 0.125)(q, k, v, (fk, fv), meta)
        plain = [dequantize_rows(quantize_rows(c, "q4_0"), "q4_0") for c in (fk, fv)]
        untouched = paged_attention_reference(q, *plain, meta, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - exact).norm() < 0.7 * (untouched - exact).norm()
