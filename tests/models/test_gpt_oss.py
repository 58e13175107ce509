"""gpt-oss (models/gpt_oss.py) beyond test_architectures.py's float fixture: its features each
change transformers' logits; MXFP4 experts kept 4-bit from OpenAI's safetensors layout and from the
GGUF llama.cpp's converter writes of it, against transformers fp32 on the dequantized weights;
batches of different lengths, the prefix cache hit at several depths and n-gram speculation all
give HF's greedy tokens."""
from __future__ import annotations

import pytest
import torch

from hf_compare import PROMPT, arch_fixture, check_greedy, check_logits, hf_greedy, hf_model, llama_cpp_gguf
from model_fixtures import FIXTURES, cached_llm
from mlxr import LLM, SamplingParams
from paged_probe import rel_err

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def hf_dir():
    return arch_fixture("tiny-gpt_oss")


@pytest.fixture(scope="module")
def hf(hf_dir):
    return hf_model(hf_dir)


@pytest.fixture(scope="module")
def mxfp4_dirs():
    from mlxr.testing.gpt_oss_fixtures import mxfp4_fixture_dirs

    return mxfp4_fixture_dirs(FIXTURES)


def test_sinks_window_and_yarn_each_change_hf_logits(hf_dir, hf):
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        want = hf(ids).logits[0]
        no_sinks = hf_model(hf_dir)
        for layer in no_sinks.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
        plain_rope = hf_model(hf_dir, rope_parameters={"rope_type": "default", "rope_theta": 150000.0})
        no_window = hf_model(hf_dir, sliding_window=4096)
        for other in (no_sinks, plain_rope, no_window):
            assert rel_err(other(ids).logits[0], want) > 1e-3


def test_loads_its_architecture(hf_dir):
    args = cached_llm(str(hf_dir)).loaded.model.args
    assert (args.sliding_window, args.sliding_layers) == (8, (True, False))
    assert (args.rope_scaling.rope_type, args.rope_scaling.truncate, args.num_experts) == ("yarn", True, 4)
    gguf_args = cached_llm(llama_cpp_gguf(hf_dir)).loaded.model.args
    assert gguf_args.rope_scaling == args.rope_scaling and gguf_args.sliding_layers == args.sliding_layers


@pytest.mark.parametrize("source", ["safetensors", "gguf"])
def test_mxfp4_experts_stay_4_bit_and_match_hf(mxfp4_dirs, source):
    from mlxr.layers.quant_linear import QuantStacked

    packed, dequantized = mxfp4_dirs
    llm = cached_llm(str(packed) if source == "safetensors" else llama_cpp_gguf(packed))
    for layer in llm.loaded.model.model.layers:
        w = layer.mlp.experts
        assert all(isinstance(p, QuantStacked) and p.qtype == "MXFP4" and p.raw.dtype == torch.uint8
                   for p in (w.gate_proj, w.up_proj, w.down_proj))
    ref = hf_model(dequantized)
    check_logits(ref, llm)
    check_greedy(ref, llm)


def test_safetensors_and_gguf_hold_the_same_mxfp4_blocks(mxfp4_dirs):
    ours = cached_llm(str(mxfp4_dirs[0])).loaded.model.model.layers
    theirs = cached_llm(llama_cpp_gguf(mxfp4_dirs[0])).loaded.model.model.layers
    for a, b in zip(ours, theirs):
        for name in ("gate_proj", "up_proj", "down_proj"):
            assert torch.equal(getattr(a.mlp.experts, name).raw, getattr(b.mlp.experts, name).raw)


def test_a_batch_of_different_lengths_gives_each_prompt_hfs_tokens(hf_dir, hf):
    prompts = [PROMPT[:5], PROMPT, PROMPT + PROMPT[:16]]  # inside, past and far past the window of 8
    outs = cached_llm(str(hf_dir)).generate(prompts, SamplingParams(max_tokens=32, **GREEDY))
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, 32) for p in prompts]


def test_prefix_cache_hits_at_several_depths_give_hfs_tokens(hf_dir, hf):
    llm = LLM(str(hf_dir), dtype="float32", block_size=16)
    prefix = (PROMPT * 2)[:48]
    llm.generate([prefix + [5]], SamplingParams(max_tokens=4, **GREEDY))
    for depth, tail in ((16, [9, 10]), (32, [11]), (48, [12, 13, 14])):
        prompt = prefix[:depth] + tail
        out = llm.generate([prompt], SamplingParams(max_tokens=16, **GREEDY))[0]
        assert out.num_cached_tokens == depth
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 16)


def test_ngram_speculation_gives_hfs_tokens(hf_dir, hf):
    llm = LLM(str(hf_dir), dtype="float32", speculative_method="ngram", num_speculative_tokens=3)
    prompt = PROMPT[:12] * 3  # a repeated prompt: prompt lookup drafts from it
    out = llm.generate([prompt], SamplingParams(max_tokens=32, **GREEDY))[0]
    assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 32)
    assert llm.engine.stats().spec_num_draft_tokens > 0


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_mxfp4_gguf_on_cuda_gives_hfs_tokens(mxfp4_dirs, graphs):
    """The MXFP4 experts through the Triton kernel, the sinks through the torch references, with
    and without CUDA graphs, fp32 activations: HF's 32 greedy tokens."""
    ref = hf_model(mxfp4_dirs[1])
    llm = LLM(llama_cpp_gguf(mxfp4_dirs[0]), dtype="float32", device="cuda", enable_cuda_graphs=graphs)
    prompts = [PROMPT[:5], PROMPT, PROMPT + PROMPT[:16]]
    outs = llm.generate(prompts, SamplingParams(max_tokens=32, **GREEDY))
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(ref, p, 32) for p in prompts]


def test_a_tiny_cache_preempts_and_still_gives_hfs_tokens(hf_dir, hf):
    llm = LLM(str(hf_dir), dtype="float32", num_kv_blocks=12, block_size=4, max_num_seqs=4,
              enable_prefix_caching=False)
    prompts = [PROMPT[:9], PROMPT[3:17], PROMPT[:5], PROMPT[6:20]]
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, **GREEDY))
    assert llm.engine.stats().num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, 16) for p in prompts]
