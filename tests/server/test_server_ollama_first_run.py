"""Ollama surface driven by the official client: /api/version, logprobs/top_logprobs on
/api/generate and /api/chat, and Ollama's truncation of prompts over num_ctx."""
from __future__ import annotations

import importlib.metadata
import json
import math

import httpx
import ollama
import pytest
from model_fixtures import fixture_model

CONTEXT = 256  # the tiny-llama fixture's context length


@pytest.fixture(scope="module")
def base_url(shared_tiny_llama_url: str) -> str:
    return shared_tiny_llama_url  # tests/server/conftest.py


@pytest.fixture(scope="module")
def client(base_url: str) -> ollama.Client:
    return ollama.Client(host=base_url, timeout=60)


@pytest.fixture(scope="module")
def name(client: ollama.Client) -> str:
    stem = fixture_model("tiny-llama").gguf_path.stem.lower()
    return next(m.model for m in client.list().models if m.model.startswith(stem))


def test_version_is_the_installed_package_version(base_url: str) -> None:
    assert httpx.get(base_url + "/api/version").json() == {"version": importlib.metadata.version("mlxr")}


def _check_logprobs(logprobs, text: str, top_n: int, tokens: int) -> None:
    assert len(logprobs) == tokens
    assert "".join(lp.token for lp in logprobs) == text
    for lp in logprobs:
        assert lp.logprob <= 0 and len(lp.top_logprobs) == top_n
        tops = [t.logprob for t in lp.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert lp.top_logprobs[0].token == lp.token and math.isclose(tops[0], lp.logprob)  # greedy


def test_generate_logprobs(client: ollama.Client, name: str) -> None:
    opts = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 6}
    r = client.generate(name, "Once upon a time", options=opts, logprobs=True, top_logprobs=3)
    _check_logprobs(r.logprobs, r.response, 3, r.eval_count)
    chunks = list(client.generate(name, "Once upon a time", options=opts, logprobs=True, top_logprobs=3, stream=True))
    streamed = [lp for c in chunks for lp in (c.logprobs or [])]
    assert [(lp.token, lp.logprob) for lp in streamed] == [(lp.token, lp.logprob) for lp in r.logprobs]
    assert client.generate(name, "Once upon a time", options=opts).logprobs is None


def test_chat_logprobs_match_the_openai_route(client: ollama.Client, name: str, base_url: str) -> None:
    messages = [{"role": "user", "content": "Hello"}]
    r = client.chat(name, messages, options={"temperature": 0, "repeat_penalty": 1.0, "num_predict": 5}, logprobs=True,
                    top_logprobs=2)  # Ollama's default repeat_penalty 1.1 would pick below the top
    _check_logprobs(r.logprobs, r.message.content, 2, r.eval_count)
    oa = httpx.post(base_url + "/v1/chat/completions", json={
        "model": name, "messages": messages, "temperature": 0, "max_tokens": 5, "logprobs": True,
        "top_logprobs": 2}, timeout=60).json()
    want = oa["choices"][0]["logprobs"]["content"]
    assert [lp.token for lp in r.logprobs] == [c["token"] for c in want]
    assert [lp.logprob for lp in r.logprobs] == pytest.approx([c["logprob"] for c in want], abs=1e-4)


@pytest.mark.parametrize("body", [{"top_logprobs": 21, "logprobs": True}, {"top_logprobs": 2}])
def test_bad_top_logprobs_is_a_400_naming_it(base_url: str, name: str, body: dict) -> None:
    r = httpx.post(base_url + "/api/generate", json={"model": name, "prompt": "hi", "stream": False, **body})
    assert r.status_code == 400 and "top_logprobs" in r.json()["error"]


def test_long_generate_prompt_is_truncated_unless_truncate_false(client: ollama.Client, name: str,
                                                                 base_url: str) -> None:
    long_prompt = " ".join(f"word{i}" for i in range(400))
    r = client.generate(name, long_prompt, raw=True, options={"num_predict": 8, "temperature": 0})
    assert r.prompt_eval_count == CONTEXT - 8 and r.eval_count >= 1
    refused = httpx.post(base_url + "/api/generate", json={
        "model": name, "prompt": long_prompt, "raw": True, "stream": False, "truncate": False,
        "options": {"num_predict": 8}}, timeout=60)
    assert refused.status_code == 400 and f"context length is {CONTEXT}" in refused.json()["error"]
    openai = httpx.post(base_url + "/v1/completions", json={"model": name, "prompt": long_prompt, "max_tokens": 8})
    assert openai.status_code == 400


def test_long_chat_drops_the_oldest_messages_keeping_system_and_latest(client: ollama.Client, name: str) -> None:
    from mlxr import LLM

    system = {"role": "system", "content": "You are terse."}
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "blah " * 12}
               for i in range(30)]
    messages = [system, *history, {"role": "user", "content": "the latest question"}]
    r = client.chat(name, messages, options={"num_predict": 8, "temperature": 0})
    tok = LLM(str(fixture_model("tiny-llama").gguf_path)).tokenizer
    lengths = [len(tok.encode(tok.apply_chat_template([system, *messages[k:]], add_generation_prompt=True),
                              add_special_tokens=False)) for k in range(1, len(messages))]
    fitting = [n for n in lengths if n <= CONTEXT - 8]
    assert fitting and r.prompt_eval_count == max(fitting)  # as many recent messages as fit


def test_a_truncated_prompt_says_so_in_the_reply(base_url: str, name: str) -> None:
    long_prompt = " ".join(f"word{i}" for i in range(400))
    options = {"num_predict": 8, "temperature": 0}
    r = httpx.post(base_url + "/api/generate", json={"model": name, "prompt": long_prompt, "raw": True,
                                                     "stream": False, "options": options}, timeout=60)
    body = r.json()
    cut = body["prompt_truncated"]
    assert cut["kept_tokens"] == body["prompt_eval_count"] == CONTEXT - 8 and cut["prompt_tokens"] > CONTEXT
    assert r.headers["x-mlxr-prompt-truncated"] == f"{cut['prompt_tokens']} {CONTEXT - 8}"
    messages = [{"role": "user", "content": long_prompt}]
    with httpx.stream("POST", base_url + "/api/chat", json={"model": name, "messages": messages, "options": options},
                      timeout=60) as s:
        lines = [line for line in s.iter_lines() if line]
        assert "x-mlxr-prompt-truncated" in s.headers
    final = json.loads(lines[-1])
    assert final["done"] and final["prompt_truncated"]["kept_tokens"] == final["prompt_eval_count"]
    short = httpx.post(base_url + "/api/generate", json={"model": name, "prompt": "Hi", "stream": False,
                                                         "options": options}, timeout=60)
    assert "prompt_truncated" not in short.json() and "x-mlxr-prompt-truncated" not in short.headers
