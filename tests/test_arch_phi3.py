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
    scaling = llm.engine.runner.model.args.rope_scaling
    assert (scaling.rope_type, scaling.original_max_position_embeddings) == ("longrope", 16)
    check_logits(hf, llm)  # positions 0..39, past 16


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_logits_match_hf_on_the_short_factors(hf, source):
    check_logits(hf, llm_for(NAME, source), PROMPT[:8], n_decode=7)  # positions 0..14


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_32_greedy_tokens_match_hf(hf, source):
    check_greedy(hf, llm_for(NAME, source))
