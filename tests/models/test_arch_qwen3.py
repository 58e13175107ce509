"""Qwen3 (per-head q/k RMSNorm) against HF transformers, from safetensors and llama.cpp's GGUF."""
from __future__ import annotations

import pytest

from arch_check import arch_fixture, check_greedy, check_logits, hf_model, llm_for

NAME = "tiny-qwen3"


@pytest.fixture(scope="module")
def hf():
    return hf_model(arch_fixture(NAME))


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_logits_match_hf(hf, source):
    check_logits(hf, llm_for(NAME, source))


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_32_greedy_tokens_match_hf(hf, source):
    check_greedy(hf, llm_for(NAME, source))

