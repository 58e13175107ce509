"""Gemma 2 (alternating sliding windows, attention and final logit soft-caps) against HF
transformers, from safetensors and llama.cpp's GGUF."""
from __future__ import annotations

import pytest
import torch

from arch_check import PROMPT, arch_fixture, check_greedy, check_logits, hf_model, llm_for
from paged_probe import rel_err

NAME = "tiny-gemma2"


@pytest.fixture(scope="module")
def hf():
    return hf_model(arch_fixture(NAME))


@pytest.mark.parametrize("change", [{"sliding_window": 4096}, {"attn_logit_softcapping": None},
                                    {"final_logit_softcapping": None}])
def test_each_feature_changes_hf_logits_of_this_prompt(hf, change):
    other = hf_model(arch_fixture(NAME), **change)
    with torch.inference_mode():
        ids = torch.tensor([PROMPT])
        assert rel_err(hf(ids).logits[0], other(ids).logits[0]) > 1e-3


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_logits_match_hf(hf, source):
    llm = llm_for(NAME, source)
    args = llm.loaded.model.args
    assert (args.sliding_window, args.sliding_layers) == (8, (True, False, True, False))
    check_logits(hf, llm)


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_32_greedy_tokens_match_hf(hf, source):
    check_greedy(hf, llm_for(NAME, source))
