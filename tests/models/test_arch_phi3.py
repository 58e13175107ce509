"""Phi-3 (fused qkv and gate_up tensors, LongRoPE) against HF transformers, from safetensors and
llama.cpp's GGUF (rope_factors_long/short tensors)."""
from __future__ import annotations

import pytest

from arch_check import PROMPT, arch_fixture, check_greedy, check_logits, hf_model, llm_for

NAME = "tiny-phi3"


@pytest.fixture(scope="module")
def hf():
    return hf_model(arch_fixture(NAME))


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_logits_match_hf_on_the_long_factors(hf, source):
    llm = llm_for(NAME, source)
    scaling = llm.loaded.model.args.rope_scaling
    assert (scaling.rope_type, scaling.original_max_position_embeddings) == ("longrope", 16)
    check_logits(hf, llm)  # positions 0..39, past 16


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_logits_match_hf_on_the_short_factors(hf, source):
    check_logits(hf, llm_for(NAME, source), PROMPT[:8], n_decode=7)  # positions 0..14


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_32_greedy_tokens_match_hf(hf, source):
    check_greedy(hf, llm_for(NAME, source))


def test_q8_0_gguf_keeps_its_fused_tensors_quantized_split_by_rows(hf):
    """llama.cpp's Q8_0 file: attn_qkv and ffn_up (gate+up) blocks are split by rows, kept as
    blocks, and give the logits of the same file dequantized."""
    from arch_check import arch_fixture
    from model_fixtures import FIXTURES, cached_llm
    from mlxr.layers.quant_linear import QuantLinear
    from mlxr.testing.llama_cpp_convert import llama_cpp_gguf
    from paged_probe import paged_logits, rel_err

    path = str(llama_cpp_gguf(arch_fixture(NAME), FIXTURES, "q8_0"))
    kept, expanded = cached_llm(path, quantization="auto"), cached_llm(path, quantization="none")
    layer = kept.loaded.model.model.layers[0]
    assert kept.loaded.quantization == "gguf"
    # the split q/k/v and gate/up blocks, merged again at load
    assert isinstance(layer.self_attn.qkv_proj, QuantLinear) and isinstance(layer.mlp.gate_up_proj, QuantLinear)
    ids = PROMPT[:12]
    assert rel_err(paged_logits(kept, ids, 8), paged_logits(expanded, ids, 8)) <= 1e-3
