"""`mlxr serve --speculative-method suffix`: greedy completions through the OpenAI client are the
plain engine's tokens, drafts are kept (the server's metrics count them), and a request that
repeats an earlier answer drafts it from the shared tree of finished outputs."""
from __future__ import annotations

import openai
import pytest
from server_harness import scrape, tiny_llama_server

from model_fixtures import cached_llm, fixture_model
from mlxr import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [11, 57, 203, 9, 388], [40, 41, 42, 40, 41]]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    with tiny_llama_server(tmp_path_factory.mktemp("home"), "--dtype", "float32", "--speculative-method", "suffix",
                           "--num-speculative-tokens", "4") as url:
        yield url


def test_greedy_completions_are_the_plain_engines_tokens(base_url, model):
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    plain = cached_llm(str(fixture_model("tiny-llama").gguf_path))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    want = [o.outputs[0].text for o in plain.generate(PROMPTS, params)]
    label = f'model_name="{model}"'
    for round_ in range(2):  # the second round's answers are in the shared tree already
        got = [client.completions.create(model=model, prompt=p, max_tokens=MAX_TOKENS, temperature=0.0,
                                         extra_body={"ignore_eos": True}).choices[0].text for p in PROMPTS]
        assert got == want
        m = scrape(base_url)
        accepted = m[f"vllm:spec_decode_num_accepted_tokens_total{{{label}}}"]
        if round_ == 0:
            first = accepted
            assert first > 0
    assert accepted - first > first  # the repeats drafted from the finished outputs too
