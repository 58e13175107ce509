"""The reasoning token budget on the OpenAI, Responses and Ollama APIs (Anthropic's
thinking.budget_tokens, the same mechanism, is in test_server_anthropic_thinking.py): a
random-weight model on a thinking template reasons until max_tokens unless bounded; with a
budget its reasoning is the first `budget` tokens it writes, the end marker is forced, and the
answer follows as content."""
from __future__ import annotations

import json
import shutil

import httpx
import ollama
import openai
import pytest
from model_fixtures import fixture_model
from server_harness import running_server

BUDGETS = {"minimal": 6, "low": 9, "medium": 12}  # MLXR_REASONING_EFFORT_TOKENS, small for a tiny model

THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}")
ASK = [{"role": "user", "content": "hi"}]
PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("thinker") / "model"
    shutil.copytree(fixture_model("tiny-llama3").hf_dir, model_dir)
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": THINKING_TEMPLATE}))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLXR_REASONING_EFFORT_TOKENS", ",".join(f"{k}={v}" for k, v in BUDGETS.items()))
        with running_server(tmp_path_factory.mktemp("home"), "--model", str(model_dir)) as url:
            yield url


@pytest.fixture(scope="module")
def model(base_url) -> str:
    return httpx.get(base_url + "/v1/models").json()["data"][0]["id"]


def raw_reasoning(base_url: str, model: str, tokens: int) -> str:
    """What the model writes after the opened reasoning, through /v1/completions."""
    body = {"model": model, "prompt": PROMPT, "temperature": 0.0, "max_tokens": tokens}
    return httpx.post(base_url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]


def test_thinking_token_budget_closes_the_reasoning_and_the_answer_follows(base_url, model):
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    args = dict(model=model, messages=ASK, temperature=0.0, max_tokens=14)
    unbounded = client.chat.completions.create(**args).choices[0].message
    assert unbounded.reasoning_content == raw_reasoning(base_url, model, 14) and not unbounded.content
    r = client.chat.completions.create(**args, extra_body={"thinking_token_budget": 5})
    m = r.choices[0].message
    assert m.reasoning_content == raw_reasoning(base_url, model, 5).split("</think>")[0]
    assert m.content and 5 < r.usage.completion_tokens <= 14
    chunks = list(client.chat.completions.create(**args, stream=True, extra_body={"thinking_token_budget": 5}))
    assert "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices) \
        == m.reasoning_content
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == m.content
    effort = client.chat.completions.create(**args, reasoning_effort="minimal").choices[0].message
    assert effort.reasoning_content == raw_reasoning(base_url, model, BUDGETS["minimal"]) and effort.content
    with pytest.raises(openai.BadRequestError, match="thinking_token_budget"):
        client.chat.completions.create(**args, n=2, extra_body={"thinking_token_budget": 5})
    with pytest.raises(openai.BadRequestError, match="thinking_token_budget"):
        client.chat.completions.create(**args, extra_body={"thinking_token_budget": -1})


def test_responses_reasoning_effort_bounds_the_reasoning(base_url, model):
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    budget = BUDGETS["minimal"]
    args = dict(model=model, input="hi", temperature=0.0)
    high = client.responses.create(**args, max_output_tokens=budget + 6, reasoning={"effort": "high"})
    assert [o.type for o in high.output] == ["reasoning"]  # unbounded: all of it reasoning
    first = client.responses.create(**args, max_output_tokens=budget, reasoning={"effort": "high"})
    r = client.responses.create(**args, max_output_tokens=budget + 6, reasoning={"effort": "minimal"})
    assert [o.type for o in r.output] == ["reasoning", "message"], r.output
    assert r.output[0].content[0].text == first.output[0].content[0].text
    assert r.output[1].content[0].text and r.usage.output_tokens == budget + 6


def test_ollama_think_level_bounds_the_reasoning(base_url, model):
    client = ollama.Client(host=base_url, timeout=120)
    budget = BUDGETS["low"]
    first = client.chat(model=model, messages=ASK, think=True, options={"temperature": 0, "num_predict": budget})
    assert first.message.thinking and not first.message.content
    options = {"temperature": 0, "num_predict": budget + 6}
    r = client.chat(model=model, messages=ASK, think="low", options=options)
    assert r.message.thinking == first.message.thinking
    assert r.message.content and r.eval_count == budget + 6
    streamed = list(client.chat(model=model, messages=ASK, think="low", options=options, stream=True))
    assert "".join(c.message.thinking or "" for c in streamed) == r.message.thinking
    assert "".join(c.message.content or "" for c in streamed) == r.message.content
    high = client.chat(model=model, messages=ASK, think="high", options=options)
    assert high.message.thinking and not high.message.content  # "high": max_tokens alone
    with pytest.raises(ollama.ResponseError, match="think"):
        client.chat(model=model, messages=ASK, think="extreme")


def test_completions_thinking_token_budget_forces_the_end_marker(base_url, model):
    body = {"model": model, "prompt": PROMPT, "temperature": 0.0, "max_tokens": 14, "thinking_token_budget": 5}
    r = httpx.post(base_url + "/v1/completions", json=body, timeout=120).json()
    reasoning = raw_reasoning(base_url, model, 5)
    text = r["choices"][0]["text"]
    assert text.startswith(reasoning + "</think>") and len(text) > len(reasoning + "</think>")
    assert r["usage"]["completion_tokens"] == 14
    r = httpx.post(base_url + "/v1/completions", json={**body, "n": 2}, timeout=120)
    assert r.status_code == 400 and "thinking_token_budget" in r.text
