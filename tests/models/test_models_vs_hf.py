"""Tiny random llama / qwen2 / gemma3 models against HF transformers on the same weights: the
variants of the architectures' own fixtures (tests/models/test_architectures.py compares those),
batching, GGUF against safetensors, logprobs."""
from __future__ import annotations

import pytest
import torch

from hf_compare import hf_greedy
from model_fixtures import cached_llm, fixture_model
from mlxr import SamplingParams
from paged_probe import paged_logits, rel_err

# Tied embeddings and llama3 rope scaling; tiny-llama, tiny-qwen2 (biases) and tiny-gemma3 (a
# sliding window of 8 with a 24-token prompt) are test_architectures.py's cases.
MODELS = ["tiny-llama-tied", "tiny-llama3"]
PROMPT = [7, 300, 45, 99, 12, 250, 3, 77, 180, 31, 64, 400, 9, 11, 222, 5, 88, 123, 301, 17, 42, 256, 19, 73]


def hf_model(name: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(fixture_model(name).hf_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=MODELS)
def pair(request):
    name = request.param
    return name, hf_model(name), cached_llm(str(fixture_model(name).hf_dir))


def test_logits_match_hf_over_prompt_and_16_decode_steps(pair):
    name, hf, llm = pair
    ids = PROMPT + hf_greedy(hf, PROMPT, 16)
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0]
    ours = paged_logits(llm, ids, len(PROMPT))
    assert ours.shape == ref.shape
    assert rel_err(ours[: len(PROMPT)], ref[: len(PROMPT)]) <= 1e-4, name
    assert rel_err(ours[len(PROMPT):], ref[len(PROMPT):]) <= 1e-4, name


def test_32_greedy_tokens_identical_to_hf(pair):
    name, hf, llm = pair
    want = hf_greedy(hf, PROMPT, 32)
    got = llm.generate([PROMPT], SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))[0]
    assert got.outputs[0].token_ids == want, name


def test_batch_of_8_prompts_matches_each_alone():
    llm = cached_llm(str(fixture_model("tiny-gemma3").hf_dir))
    prompts = [PROMPT[: 3 * i + 1] for i in range(8)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    batch = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert batch == [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
@pytest.mark.parametrize("gguf_type", ["f32", "f16"])
def test_gguf_and_safetensors_give_identical_logits(name, gguf_type):
    paths = fixture_model(name, gguf_type)
    from_gguf = cached_llm(str(paths.gguf_path))
    from_hf = cached_llm(str(paths.hf_dir))
    ids = PROMPT[:20]
    assert torch.equal(paged_logits(from_gguf, ids, 12), paged_logits(from_hf, ids, 12))


def test_logprobs_match_log_softmax_of_hf_logits():
    name = "tiny-llama"
    hf, llm = hf_model(name), cached_llm(str(fixture_model(name).hf_dir))
    out = llm.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=3))[0].outputs[0]
    ids = PROMPT + out.token_ids
    with torch.inference_mode():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), -1)
    for step, (tok, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        row = ref[len(PROMPT) - 1 + step]
        assert entry[tok].logprob == pytest.approx(float(row[tok]), abs=1e-4)
        assert entry[tok].rank == 1
        top3 = torch.topk(row, 3).indices.tolist()
        assert set(top3) <= set(entry)


@pytest.mark.parametrize("name", ["tiny-llama3"])  # the others: test_architectures.py's "gguf" source
def test_gguf_from_llama_cpp_converter_matches_hf(name):
    """The same HF directory through llama.cpp's own convert_hf_to_gguf.py (an independent writer)."""
    from hf_compare import check_greedy, check_logits, llama_cpp_gguf

    hf, llm = hf_model(name), cached_llm(llama_cpp_gguf(fixture_model(name).hf_dir))
    check_logits(hf, llm, PROMPT)
    check_greedy(hf, llm, PROMPT)
