"""Gemma 4 text (models/gemma4.py) beyond test_architectures.py's comparison with transformers:
the layers sharing K/V read their source's cache under batching, prefix-cache hits and n-gram
speculation (each gives HF's greedy tokens), and the settings not supported yet are refused
naming them."""
from __future__ import annotations

import json
import shutil

import pytest

from hf_compare import PROMPT, arch_fixture, hf_greedy, hf_model
from mlxr import LLM, SamplingParams
from mlxr.errors import UnsupportedModelError
from model_fixtures import cached_llm

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def hf_dir():
    return arch_fixture("tiny-gemma4")


@pytest.fixture(scope="module")
def hf(hf_dir):
    return hf_model(hf_dir)


def test_shared_layers_read_the_last_earlier_layer_of_their_type(hf_dir):
    model = cached_llm(str(hf_dir)).loaded.model.model
    assert model.sources == (0, 1, 2, 3, 2, 3)
    assert not hasattr(model.layers[4].self_attn, "k_proj") and model.layers[4].mlp.down_proj.in_features == 256
    assert model.layers[1].self_attn.v_proj is None and model.layers[0].self_attn.v_proj is not None


def test_a_batch_of_different_lengths_gives_each_prompt_hfs_tokens(hf_dir, hf):
    prompts = [PROMPT[:5], PROMPT, PROMPT + PROMPT[:16]]
    outs = cached_llm(str(hf_dir)).generate(prompts, SamplingParams(max_tokens=32, **GREEDY))
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, 32) for p in prompts]


def test_prefix_cache_hits_and_ngram_speculation_give_hfs_tokens(hf_dir, hf):
    llm = LLM(str(hf_dir), dtype="float32", block_size=16, speculative_method="ngram", num_speculative_tokens=3)
    prefix = (PROMPT * 2)[:32]
    llm.generate([prefix + [5]], SamplingParams(max_tokens=4, **GREEDY))
    for depth, tail in ((16, [9, 10]), (32, [11])):
        prompt = prefix[:depth] + tail
        out = llm.generate([prompt], SamplingParams(max_tokens=16, **GREEDY))[0]
        assert out.num_cached_tokens == depth
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 16)
    looping = PROMPT[:12] * 3  # a repeated prompt: prompt lookup drafts from it
    out = llm.generate([looping], SamplingParams(max_tokens=32, **GREEDY))[0]
    assert out.outputs[0].token_ids == hf_greedy(hf, looping, 32)
    assert llm.engine.stats().spec_num_draft_tokens > 0


@pytest.mark.parametrize(("change", "named"), [
    ({"per_layer_config": {"1": {"head_dim": 32}}}, "global_head_dim"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                          "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                             "rope_theta": 1e6}}}, "partial_rotary_factor|proportional"),
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
])
def test_settings_not_supported_yet_are_refused_naming_them(hf_dir, tmp_path, change, named):
    model = tmp_path / "m"
    shutil.copytree(hf_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(UnsupportedModelError, match=named):
        LLM(str(model), dtype="float32")


def test_a_tiny_cache_preempts_and_still_gives_hfs_tokens(hf_dir, hf):
    llm = LLM(str(hf_dir), dtype="float32", num_kv_blocks=12, block_size=4, max_num_seqs=4,
              enable_prefix_caching=False)
    prompts = [PROMPT[:9], PROMPT[3:17], PROMPT[:5], PROMPT[6:20]]
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, **GREEDY))
    assert llm.engine.stats().num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, 16) for p in prompts]
