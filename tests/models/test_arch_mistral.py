"""Mistral (a sliding window on every layer) against HF transformers: from safetensors, from the
GGUF MLXR's converter writes (it keeps the window) and from llama.cpp's converter (it keeps none,
so the file runs full attention, as in llama.cpp: compared with HF's model without a window)."""
from __future__ import annotations

import pytest
import torch

from arch_check import PROMPT, check_greedy, check_logits, hf_model, llama_cpp_gguf
from model_fixtures import cached_llm, fixture_model
from paged_probe import rel_err

NAME = "tiny-mistral"


@pytest.fixture(scope="module")
def hf():
    return hf_model(fixture_model(NAME).hf_dir)


def _path(source: str) -> str:
    paths = fixture_model(NAME)
    return str(paths.hf_dir if source == "safetensors" else paths.gguf_path)


def test_the_window_changes_the_logits_of_this_prompt(hf):
    full = hf_model(fixture_model(NAME).hf_dir, sliding_window=None)
    with torch.inference_mode():
        ids = torch.tensor([PROMPT])
        assert rel_err(hf(ids).logits[0], full(ids).logits[0]) > 1e-2


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_logits_match_hf(hf, source):
    llm = cached_llm(_path(source))
    assert llm.loaded.model.args.sliding_window == 8
    check_logits(hf, llm)


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_32_greedy_tokens_match_hf(hf, source):
    check_greedy(hf, cached_llm(_path(source)))


def test_llama_cpp_gguf_runs_full_attention_as_llama_cpp_does():
    llm = cached_llm(llama_cpp_gguf(fixture_model(NAME).hf_dir))
    assert llm.loaded.model.args.sliding_window is None
    full = hf_model(fixture_model(NAME).hf_dir, sliding_window=None)
    check_logits(full, llm)
    check_greedy(full, llm)
