"""The LLM API on a tiny model: stop strings across tokens, seeds, validation, prompts forms."""
from __future__ import annotations

import pytest

from model_fixtures import cached_llm, fixture_model
from mlxr import SamplingParams
from mlxr.errors import InvalidParameterError

PROMPT = "Once upon a time, in a land"


@pytest.fixture(scope="module")
def llm():
    return cached_llm(str(fixture_model("tiny-llama").hf_dir))


def greedy(llm, **kw):
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, **kw)
    return llm.generate(PROMPT, params)[0].outputs[0]


def token_boundaries(llm, ids: list[int]) -> list[int]:
    """Character offsets where one generated token's text ends."""
    ends, text = [], ""
    for i in range(1, len(ids) + 1):
        text = llm.tokenizer.decode(ids[:i])
        ends.append(len(text))
    return ends


def test_stop_string_spanning_tokens_is_cut_and_never_leaked(llm):
    full = greedy(llm)
    ends = token_boundaries(llm, full.token_ids)
    # A stop string that starts inside one token and ends inside a later one.
    cut = next(e for e in ends if 4 <= e < len(full.text) - 6)
    stop = full.text[cut - 2 : cut + 3]
    assert stop.strip(), "need a visible stop string"
    first = full.text.find(stop)
    out = greedy(llm, stop=[stop])
    assert out.text == full.text[:first]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert stop not in out.text


def test_stop_token_ids_and_max_tokens(llm):
    full = greedy(llm)
    target = full.token_ids[5]
    out = greedy(llm, stop_token_ids=[target])
    assert out.token_ids == full.token_ids[: full.token_ids.index(target) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == target
    assert greedy(llm).finish_reason == "length"


def test_seed_reproduces_whatever_else_is_in_the_batch(llm):
    seeded = SamplingParams(max_tokens=20, temperature=1.0, seed=42)
    other = SamplingParams(max_tokens=20, temperature=1.0)
    alone = llm.generate(PROMPT, seeded)[0].outputs[0].text
    batch = llm.generate(["Hello there", PROMPT, "A third prompt"], [other, seeded, other])
    assert batch[1].outputs[0].text == alone
    assert llm.generate(PROMPT, SamplingParams(max_tokens=20, temperature=1.0, seed=43))[0].outputs[0].text != alone


def test_prompt_forms_and_output_shape(llm):
    ids = llm.tokenizer.encode(PROMPT)
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    from_text = llm.generate(PROMPT, params)[0]
    from_ids = llm.generate([ids], params)[0]
    assert from_text.outputs[0].token_ids == from_ids.outputs[0].token_ids
    assert from_text.prompt == PROMPT and from_text.prompt_token_ids == ids
    assert from_ids.outputs[0].text == from_text.outputs[0].text


@pytest.mark.parametrize(
    "field,value",
    [("temperature", -1.0), ("top_p", 0.0), ("top_k", -5), ("n", 0), ("max_tokens", -3),
     ("logprobs", 99), ("min_p", 2.0), ("presence_penalty", 5.0), ("temperature", float("nan"))],
)
def test_invalid_sampling_values_name_the_field(field, value):
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(**{field: value})
    assert e.value.param == field


def test_invalid_prompts_are_refused(llm):
    with pytest.raises(InvalidParameterError):
        llm.generate([[]], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidParameterError):
        llm.generate([[5, 6], [1, 10**9]], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidParameterError) as e:
        llm.generate(PROMPT, SamplingParams(max_tokens=2, logit_bias={10**6: 1.0}))
    assert e.value.param == "logit_bias"
    assert not llm.engine.has_unfinished()
