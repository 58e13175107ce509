"""Qwen3.5's own multi-token-prediction layer as the mtp proposer, dense and MoE, from the HF
directory (`mtp.*`, as the released checkpoints lay it out) and from the GGUF llama.cpp's own
converter writes with it (`blk.4.nextn.*`, nextn_predict_layers). The fixture's MTP layer passes
the next token's embedding through beside a target whose layers write little into the stream
(hybrid_fixtures.echo_mtp_weights): some drafts are kept, others rejected, so drafting steps roll
the DeltaNet layers' recurrent state back to the last kept token; greedy output must stay the
plain engine's token for token."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from hf_compare import PROMPT
from model_fixtures import FIXTURES, cached_llm
from mlxr import LLM, SamplingParams
from mlxr.errors import ModelFormatError

VARIANTS = ("tiny-qwen35", "tiny-qwen35moe")
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
PROMPTS = [PROMPT[:n] for n in (3, 24, 11, 1)]


def mtp_dir(variant: str):
    from mlxr.testing.hybrid_fixtures import hybrid_mtp_fixture_dir

    return hybrid_mtp_fixture_dir(variant, FIXTURES, echo=True)


def mtp_gguf(variant: str) -> str:
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable, llama_cpp_gguf

    try:
        return str(llama_cpp_gguf(mtp_dir(variant), FIXTURES, "f32"))
    except ConverterUnavailable as e:
        pytest.skip(str(e))


def spec_llm(path: str, k: int = 3) -> LLM:
    return LLM(path, dtype="float32", speculative_method="mtp", speculative_model=path, num_speculative_tokens=k)


def tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_with_mtp_drafts_are_plain_decodings_batched(variant):
    """Four requests of different lengths batched: the same tokens as the plain engine, with
    drafts kept and rejected (the state rolled back to the last kept token)."""
    path = str(mtp_dir(variant))
    want = tokens(cached_llm(path).generate(PROMPTS, GREEDY))
    spec = spec_llm(path)
    assert tokens(spec.generate(PROMPTS, GREEDY)) == want
    stats = spec.engine.core.core.speculator.stats
    assert 5 < stats.num_accepted_tokens < stats.num_draft_tokens - 5


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_gguf_keeps_its_mtp_layer_and_drafts_with_it(variant):
    """llama.cpp's converter, run without --no-mtp: the model loads (the nextn layer is not one
    of its layers) and gives the HF directory's tokens; the proposer's MTP layer from the GGUF
    is the HF directory's, tensor for tensor; greedy tokens with its drafts are the plain ones."""
    path, gguf = str(mtp_dir(variant)), mtp_gguf(variant)
    want = tokens(cached_llm(path).generate(PROMPTS, GREEDY))
    assert tokens(cached_llm(gguf).generate(PROMPTS, GREEDY)) == want
    from_gguf, from_hf = spec_llm(gguf), spec_llm(path)
    a = from_gguf.engine.core.core.speculator.proposer.head.layer.state_dict()
    b = from_hf.engine.core.core.speculator.proposer.head.layer.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
    assert tokens(from_gguf.generate(PROMPTS, GREEDY)) == want


def test_the_mtp_block_is_the_targets_full_attention_block_with_its_experts():
    from mlxr.layers.moe import SparseMoE
    from mlxr.models.qwen35 import Qwen35Attention

    head = spec_llm(str(mtp_dir("tiny-qwen35moe"))).engine.core.core.speculator.proposer.head
    block = head.layer.layers[0]
    assert not block.is_linear and isinstance(block.self_attn, Qwen35Attention)
    assert isinstance(block.mlp, SparseMoE)
    assert head.kv_args.linear_attention is None and head.kv_args.num_hidden_layers == 1


def test_a_gguf_converted_without_mtp_is_refused_for_mtp():
    from mlxr.testing.hybrid_fixtures import hybrid_fixture_dir
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable, llama_cpp_gguf

    try:
        gguf = str(llama_cpp_gguf(hybrid_fixture_dir("tiny-qwen35", FIXTURES), FIXTURES, "f32", ("--no-mtp",)))
    except ConverterUnavailable as e:
        pytest.skip(str(e))
    with pytest.raises(ModelFormatError, match="no nextn_predict_layers"):
        spec_llm(gguf)


@pytest.mark.slow
@pytest.mark.parametrize("variant,source", [("tiny-qwen35", "hf"), ("tiny-qwen35moe", "gguf")])
def test_sampling_with_qwen35_mtp_drafts_is_distributed_as_plain(variant, source):
    """4,000 draws of the first three tokens (top_k=4 at temperature 1) against the plain
    engine's exact probabilities: the layer's sampled drafts are kept with probability
    min(1, p/q) and replaced from max(0, p - q) otherwise (both happen)."""
    from test_spec_lossless import TOP_K, chi_square_p, exact_distribution

    path, samples = (str(mtp_dir(variant)) if source == "hf" else mtp_gguf(variant)), 4000
    prompt = PROMPT[:12]
    probs = exact_distribution(cached_llm(path), prompt)
    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=TOP_K, ignore_eos=True)
    spec = LLM(path, dtype="float32", num_speculative_tokens=2, max_num_seqs=512, speculative_max_batch=1024,
               max_num_batched_tokens=8192, speculative_method="mtp", speculative_model=path)
    counts: Counter = Counter()
    for _ in range(samples // 500):
        for o in spec.generate([prompt] * 500, params):
            counts[tuple(o.outputs[0].token_ids)] += 1
    stats = spec.engine.core.core.speculator.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert chi_square_p(counts, probs, samples) > 0.01


def test_serve_reads_the_mtp_layer_of_a_served_gguf(tmp_path):
    """`mlxr serve MODEL.gguf --speculative-method mtp`: the served file is the MTP layer's too."""
    import argparse

    from mlxr.cli.serve import head_model_path

    gguf = mtp_gguf("tiny-qwen35")
    ns = argparse.Namespace(speculative_model=None, speculative_method="mtp", model=[gguf])
    assert head_model_path(ns) == str(Path(gguf).resolve())
    ns = argparse.Namespace(speculative_model=None, speculative_method="mtp", model=["smollm2:135m"])
    assert head_model_path(ns) is None  # a registry name: --speculative-model must name the checkpoint


@pytest.mark.slow
def test_a_trained_qwen35_mtp_layer_drafts_what_the_target_writes(tmp_path):
    """Trained 100 CPU steps to copy tiny-qwen35 with its mixers' outputs scaled: most first
    drafts are kept, and the greedy tokens stay the plain target's."""
    from mlxr.testing.hybrid_fixtures import hybrid_fixture_dir, write_scaled_mixer_target
    from mlxr.testing.qwen35_mtp_training import train_qwen35_mtp

    target = write_scaled_mixer_target(hybrid_fixture_dir("tiny-qwen35", FIXTURES), tmp_path / "target", 0.05)
    head, _ = train_qwen35_mtp(target, tmp_path / "mtp", steps=100, lr=1e-2)
    prompts = torch.randint(3, 512, (4, 8), generator=torch.Generator().manual_seed(7)).tolist()
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    want = tokens(LLM(str(target), dtype="float32").generate(prompts, params))
    spec = spec_llm(str(head), k=4)
    assert tokens(spec.generate(prompts, params)) == want
    stats = spec.engine.core.core.speculator.stats
    assert stats.accepted_per_position[0] > 0.5 * stats.num_drafts


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_gguf_with_its_mtp_layer_gives_hf_logits(variant):
    """The model from the GGUF that keeps its nextn layer against transformers fp32 (which drops
    mtp.* on load): the extra layer is no part of the model."""
    from hf_compare import check_logits, hf_model

    check_logits(hf_model(mtp_dir(variant)), cached_llm(mtp_gguf(variant)))


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_llama_cpp_runs_the_mtp_gguf_to_the_same_tokens(variant):
    """llama.cpp's llama-server on the file its converter wrote with the MTP layer gives MLXR's
    greedy tokens (plain decoding on both sides)."""
    from hf_compare import llama_server_tokens

    gguf = mtp_gguf(variant)
    ours = cached_llm(gguf).generate([PROMPT], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    assert llama_server_tokens(gguf, 16) == ours[0].outputs[0].token_ids


@pytest.mark.parametrize("nextn,want", [(None, 4), (0, 4), (1, 3), (4, None), (-1, None), (True, None)])
def test_nextn_predict_layers_are_counted_out_of_block_count(nextn, want):
    from mlxr.formats.gguf_config import _Meta, main_layer_count

    meta = {"qwen35.block_count": 4} | ({} if nextn is None else {"qwen35.nextn_predict_layers": nextn})
    if want is None:
        with pytest.raises(ModelFormatError, match="nextn_predict_layers"):
            main_layer_count(_Meta(meta, "qwen35"))
    else:
        assert main_layer_count(_Meta(meta, "qwen35")) == want
