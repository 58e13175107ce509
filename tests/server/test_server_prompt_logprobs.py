"""Prompt logprobs over HTTP with the official openai client: the legacy echo + logprobs of
/v1/completions (lm-evaluation-harness's loglikelihood requests) and vLLM's prompt_logprobs,
checked against HF transformers on the same weights."""
from __future__ import annotations

import httpx
import openai
import pytest
from server_harness import tiny_llama_server
from prompt_logprobs_reference import PROMPT, hf_prompt_logprobs


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    # float32 weights, as the reference's (the CPU default stores them in float16)
    with tiny_llama_server(tmp_path_factory.mktemp("home"), "--dtype", "float32") as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    c = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=60)
    yield c
    c.close()


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def ref():
    return hf_prompt_logprobs("tiny-llama", PROMPT)


def check_prompt_part(lp, ref, top_n: int) -> None:
    n = len(PROMPT)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for pos in range(1, n):
        assert lp.token_logprobs[pos] == pytest.approx(ref[pos - 1, PROMPT[pos]].item(), abs=2e-4)
        best = ref[pos - 1].topk(top_n).values.tolist()
        assert sorted(lp.top_logprobs[pos].values(), reverse=True)[:top_n] == pytest.approx(best, abs=2e-4)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_echo_with_logprobs_and_no_tokens_scores_the_prompt(client, model, ref):
    r = client.completions.create(model=model, prompt=PROMPT, echo=True, logprobs=2, max_tokens=0)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and r.usage.completion_tokens == 0
    assert len(choice.logprobs.tokens) == len(PROMPT)
    assert "".join(choice.logprobs.tokens).endswith(choice.text[-5:])
    check_prompt_part(choice.logprobs, ref, 2)


def test_echo_with_logprobs_then_generated_tokens(client, model, ref):
    r = client.completions.create(model=model, prompt=PROMPT, echo=True, logprobs=1, max_tokens=3,
                                  temperature=0)
    choice, n = r.choices[0], len(PROMPT)
    lp = choice.logprobs
    assert len(lp.tokens) == n + 3 and r.usage.completion_tokens == 3
    check_prompt_part(lp, ref, 1)
    alone = client.completions.create(model=model, prompt=PROMPT, logprobs=1, max_tokens=3, temperature=0)
    assert lp.token_logprobs[n:] == alone.choices[0].logprobs.token_logprobs
    # Offsets go on from the prompt's tokens (as vLLM's: the sum of the tokens' texts).
    assert lp.text_offset[n] == lp.text_offset[n - 1] + len(lp.tokens[n - 1])


def test_streamed_echo_with_logprobs_equals_the_whole_reply(client, model):
    kw = {"model": model, "prompt": PROMPT, "echo": True, "logprobs": 2, "max_tokens": 4, "temperature": 0}
    whole = client.completions.create(**kw).choices[0]
    tokens, values, text = [], [], ""
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            text += c.text
            if c.logprobs:
                tokens += c.logprobs.tokens
                values += c.logprobs.token_logprobs
    assert text == whole.text and tokens == whole.logprobs.tokens and values == whole.logprobs.token_logprobs
    zero = list(client.completions.create(stream=True, **{**kw, "max_tokens": 0}))
    assert [c.choices[0].finish_reason for c in zero if c.choices][-1] == "length"


def test_several_prompts_and_samples_each_echo_their_own_prompt(client, model):
    prompts = [PROMPT[:9], PROMPT[3:15]]
    r = client.completions.create(model=model, prompt=prompts, n=2, echo=True, logprobs=1, max_tokens=0)
    assert len(r.choices) == 4
    for c in r.choices:
        alone = client.completions.create(model=model, prompt=prompts[c.index // 2], echo=True, logprobs=1,
                                          max_tokens=0).choices[0]
        assert c.text == alone.text and c.logprobs.token_logprobs == alone.logprobs.token_logprobs


def test_vllm_prompt_logprobs_on_completions_and_chat(client, model, ref):
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 1})
    scored = r.choices[0].model_extra["prompt_logprobs"]
    assert scored[0] is None and len(scored) == len(PROMPT)
    for pos in range(1, len(PROMPT)):
        entry = scored[pos][str(PROMPT[pos])]
        assert entry["logprob"] == pytest.approx(ref[pos - 1, PROMPT[pos]].item(), abs=2e-4)
        assert entry["rank"] == int((ref[pos - 1] > ref[pos - 1, PROMPT[pos]]).sum()) + 1
        assert len(scored[pos]) <= 2
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi there"}],
                                          max_tokens=1, extra_body={"prompt_logprobs": 0})
    per_token = chat.model_extra["prompt_logprobs"]
    assert per_token[0] is None and all(len(e) == 1 for e in per_token[1:])
    assert chat.usage.prompt_tokens == len(per_token)


def test_no_tokens_without_echo_is_a_400(base_url, model):
    r = httpx.post(base_url + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
