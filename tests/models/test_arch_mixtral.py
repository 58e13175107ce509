"""mixtral (sparse experts: router top-k over more experts than it picks; GGUF ffn_*_exps) against HF transformers, from safetensors and llama.cpp's GGUF."""
from __future__ import annotations

import pytest

from arch_check import arch_fixture, check_greedy, check_logits, hf_model, llm_for

NAME = "tiny-mixtral"


@pytest.fixture(scope="module")
def hf():
    return hf_model(arch_fixture(NAME))


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_logits_match_hf(hf, source):
    check_logits(hf, llm_for(NAME, source))


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_32_greedy_tokens_match_hf(hf, source):
    check_greedy(hf, llm_for(NAME, source))



def test_q8_0_gguf_keeps_expert_tensors_quantized():
    """llama.cpp's Q8_0 file: ffn_*_exps stay as the file's blocks, multiplied per expert by the
    quantized kernels, with the logits of the same file dequantized."""
    from model_fixtures import FIXTURES, cached_llm
    from mlxr.layers.moe import QuantStacked
    from mlxr.testing.llama_cpp_convert import llama_cpp_gguf
    from paged_probe import paged_logits, rel_err
    from arch_check import PROMPT

    path = str(llama_cpp_gguf(arch_fixture(NAME), FIXTURES, "q8_0"))
    kept, expanded = cached_llm(path, quantization="auto"), cached_llm(path, quantization="none")
    experts = kept.loaded.model.model.layers[0].mlp.experts
    assert all(isinstance(m, QuantStacked) and m.qtype == "Q8_0"
               for m in (experts.gate_proj, experts.up_proj, experts.down_proj))
    ids = PROMPT[:12]
    assert rel_err(paged_logits(kept, ids, 8), paged_logits(expanded, ids, 8)) <= 1e-3
