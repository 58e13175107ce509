"""Merged projections: the same outputs as the separate layers, merged only where possible."""
from __future__ import annotations

import torch
from torch import nn

from model_fixtures import fixture_model
from mlxr.layers.fused_linear import merge_linears
from mlxr.layers.quant_linear import PackedWeight, QuantLinear
from mlxr.loader import load_model


def test_merged_linear_outputs_are_the_concatenated_outputs():
    torch.manual_seed(0)
    parts = [nn.Linear(16, n, bias=True) for n in (8, 4, 4)]
    merged = merge_linears(parts)
    x = torch.randn(3, 16)
    want = torch.cat([p(x) for p in parts], dim=-1)
    torch.testing.assert_close(merged(x), want, rtol=0, atol=0)


def test_layers_that_cannot_merge_are_left_alone():
    a, b = nn.Linear(16, 8, bias=False), nn.Linear(16, 8, bias=True)
    assert merge_linears([a, b]) is None  # one bias, not the other
    c = nn.Linear(16, 8, bias=False).to(torch.float16)
    assert merge_linears([a, c]) is None  # dtypes differ
    assert merge_linears([a, nn.Identity()]) is None


def test_loaded_models_fuse_plain_weights_and_keep_quantized_ones():
    plain = load_model(str(fixture_model("tiny-qwen2").hf_dir), dtype=torch.float32).model
    attn, mlp = plain.model.layers[0].self_attn, plain.model.layers[0].mlp
    assert attn.qkv_proj is not None and attn.q_proj is None and attn.qkv_proj.bias is not None
    assert mlp.gate_up_proj is not None and mlp.gate_proj is None
    quant = load_model(str(fixture_model("tiny-llama", "q8_0").gguf_path)).model
    attn = quant.model.layers[0].self_attn
    assert type(attn.qkv_proj) is QuantLinear and attn.qkv_proj.qtype == "Q8_0"


def test_quantized_rows_merge_when_their_type_matches():
    from test_quant_kernels import make_raw

    def q(n: int, k: int, qtype: str, seed: int) -> QuantLinear:
        return QuantLinear(PackedWeight(torch.from_numpy(make_raw(qtype, n, k, seed)), qtype, (n, k)))

    parts = [q(8, 64, "Q8_0", 1), q(4, 64, "Q8_0", 2)]
    merged = merge_linears(parts)
    x = torch.randn(2, 64)
    torch.testing.assert_close(merged(x), torch.cat([p(x) for p in parts], dim=-1), rtol=0, atol=0)
    assert merge_linears([parts[0], q(4, 64, "Q4_0", 3)]) is None
