"""Qwen3.5 dense and MoE (hybrid: Gated DeltaNet layers with a recurrent state, and gated full
attention) against HF transformers fp32 on tiny random checkpoints written by transformers itself."""
from __future__ import annotations


import pytest
import torch

from hf_compare import PROMPT, check_greedy, check_logits, hf_model, llama_server_tokens
from model_fixtures import FIXTURES, cached_llm
from paged_probe import rel_err

from mlxr import SamplingParams


VARIANTS = ("tiny-qwen35", "tiny-qwen35moe")


def fixture_dir(name: str):
    from mlxr.testing.hybrid_fixtures import hybrid_fixture_dir

    return hybrid_fixture_dir(name, FIXTURES)


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def hf(variant):
    return hf_model(fixture_dir(variant))


@pytest.fixture(scope="module")
def llm(variant):
    return lambda **kwargs: cached_llm(str(fixture_dir(variant)), **kwargs)


def test_prompt_and_decode_logits_match_hf(hf, llm):
    check_logits(hf, llm())


def test_32_greedy_tokens_match_hf(hf, llm):
    check_greedy(hf, llm())


def test_decode_steps_replay_the_cpu_graphs_and_match_hf(hf, llm, variant):
    """The recorded decode steps carry the rows' state slots, and a row at its first token (a
    one-token prompt) starts from zeros in the replay too. (The MoE variant's routing reads on
    the host: it records nothing and stays eager.)"""
    from hf_compare import hf_greedy

    model = llm()
    graphs = model.engine.core.core.runner.graphs
    if variant.endswith("moe"):
        assert graphs is None
    else:
        assert graphs is not None and sorted(graphs.graphs) == list(range(1, 9))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    alone = model.generate([[17]], params)  # its first step is a decode row of context length 1
    assert alone[0].outputs[0].token_ids == hf_greedy(hf, [17], 6)
    prompts = [[17], [5, 9, 200, 31], [44, 45]]
    outs = model.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p, 6) for p in prompts]


def test_a_prompt_longer_than_a_scan_chunk_matches_hf(hf, llm):
    """70 tokens: the chunked scan carries its state across a chunk boundary (64)."""
    prompt = [(i * 37 + 11) % 500 + 3 for i in range(70)]
    check_logits(hf, llm(), prompt, n_decode=4)


def test_prompt_chunks_split_across_steps_match_hf(hf, llm):
    """A prompt computed in chunks of 8 tokens a step: each chunk starts from the state the last left."""
    check_greedy(hf, llm(max_num_batched_tokens=8, step_time_target_s=0.0))


def test_batched_requests_of_different_lengths_give_their_own_tokens(hf, llm):
    from hf_compare import hf_greedy

    prompts = [PROMPT[:n] for n in (3, 24, 11, 1, 17)]
    outs = llm().generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 12)


def test_overlapped_steps_read_the_last_token_on_the_device(hf, llm):
    """Step N+1 launched before step N's tokens land (CUDA's default, here on the CPU): the state
    slots ride beside the in-flight tokens."""
    from hf_compare import hf_greedy

    prompts = [PROMPT[:n] for n in (5, 19, 2)]
    outs = llm(overlap_steps=True).generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 12)


def test_preempted_requests_recompute_their_state(hf, llm):
    """KV blocks for about one request: the others are preempted, recomputed from scratch (their
    state slot given back and taken anew) and still give HF's tokens."""
    from hf_compare import hf_greedy

    small = llm(num_kv_blocks=6, block_size=8, max_num_seqs=4)
    prompts = [PROMPT[:n] for n in (20, 14, 9, 17)]
    outs = small.generate(prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    core = small.engine.core.core
    assert core.scheduler.counters.num_preemptions > 0
    # Every slot back, but those of requests that finished in the last step: the runner learns
    # of those with the next step (as it does of their blocks).
    assert set(core.kv.state.slot_of) <= set(core.scheduler._finished_ids)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 24)


def test_the_state_layers_keep_no_kv_blocks(llm):
    kv = llm().engine.core.core.kv
    assert len(kv.layers) == 1 and len(kv.model_layers) == 4
    conv, delta = kv.model_layers[0]
    assert conv.shape[1:] == (2 * 2 * 16 + 4 * 16, 3) and delta.shape[1:] == (4, 16, 16)
    per_request = llm().engine.core.core.parts.args.linear_attention.state_bytes_per_sequence()
    assert per_request == 3 * (128 * 3 + 4 * 16 * 16) * 4  # three DeltaNet layers, fp32
    assert kv.state.nbytes == per_request * (kv.state.num_slots + 1)  # the slots and the scratch slot


def test_ngram_speculation_rolls_the_state_back_to_the_last_accepted_token(hf, llm):
    """Prompts A + B + A, B the greedy continuation of A alone: prompt lookup drafts B after the
    second A, which the model takes in part. The greedy tokens stay HF's, which they would not
    if a rejected draft's update stayed in the state."""
    from hf_compare import hf_greedy

    spec = llm(speculative_method="ngram", num_speculative_tokens=3)
    prompts = []
    for a in (PROMPT[:6], PROMPT[6:12], PROMPT[3:7]):
        prompts.append(a + hf_greedy(hf, a, 8) + a)
    outs = spec.generate(prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    stats = spec.engine.core.core.speculator.stats
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 24)
    assert stats.num_draft_tokens > stats.num_accepted_tokens  # some drafts were rejected


@pytest.mark.parametrize("part", ["linear_attn.out_proj", "mlp.shared_expert.down_proj"])
def test_hf_logits_depend_on_each_feature(part):
    """The fixture's DeltaNet layers and the MoE's shared expert matter: zeroing either changes
    HF's logits a lot (so matching them checks each)."""
    hf = hf_model(fixture_dir("tiny-qwen35moe"))
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        ref = hf(ids).logits[0]
        for layer in hf.model.layers:
            if hasattr(layer, part.split(".")[0]):
                layer.get_submodule(part).weight.zero_()
        changed = hf(ids).logits[0]
    assert rel_err(changed, ref) > 0.05


@pytest.fixture(scope="module")
def gguf_llm(variant):
    path = llama_cpp_gguf_no_mtp(fixture_dir(variant))
    return cached_llm(path)


def llama_cpp_gguf_no_mtp(hf_dir) -> str:
    """llama.cpp's own converter's f32 GGUF (the fixture has no multi-token-prediction layer)."""
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable, llama_cpp_gguf

    try:
        return str(llama_cpp_gguf(hf_dir, FIXTURES, "f32", ("--no-mtp",)))
    except ConverterUnavailable as e:
        pytest.skip(str(e))


def test_llama_cpp_gguf_logits_match_hf(hf, gguf_llm):
    check_logits(hf, gguf_llm)


def test_llama_cpp_gguf_32_greedy_tokens_match_hf(hf, gguf_llm):
    check_greedy(hf, gguf_llm)


@pytest.mark.slow
def test_llama_cpp_runs_the_gguf_to_the_same_32_tokens(gguf_llm, variant):
    """llama.cpp itself, on the file its converter wrote, gives MLXR's (and HF's) greedy tokens."""
    ours = gguf_llm.generate([PROMPT], SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    assert llama_server_tokens(llama_cpp_gguf_no_mtp(fixture_dir(variant)), 32) == ours[0].outputs[0].token_ids


def test_a_block_past_the_layer_table_is_gated_full_attention(llm):
    """What a multi-token-prediction proposer builds from the target's block class: Qwen3.5's MTP
    layer is a full-attention layer."""
    from mlxr.models.qwen35 import Qwen35Attention, Qwen35Block

    args = llm().engine.core.core.parts.args
    block = Qwen35Block(args, args.num_hidden_layers)
    assert isinstance(block.self_attn, Qwen35Attention) and not block.is_linear


@pytest.mark.gpu
def test_on_cuda_batched_greedy_tokens_match_hf(hf, variant):
    """The same reference ops on CUDA (graphs are off for hybrid models): batched requests of
    different lengths give HF's greedy tokens."""
    from mlxr import LLM
    from hf_compare import hf_greedy

    gpu = LLM(str(fixture_dir(variant)), dtype="float32", device="cuda")
    prompts = [PROMPT[:n] for n in (3, 24, 11, 1)]
    outs = gpu.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 16)
