"""`mlxr serve --stream-interval k`: a streamed response writes k tokens at least per chunk,
except its first token and its end, and the text is the same as without it."""
from __future__ import annotations

import argparse

import ollama
import openai
import pytest
from server_harness import tiny_llama_server

from mlxr.cli.serve import stream_interval

INTERVAL = 4
GEN = 18  # 1 first token + 4 chunks of 4 + a last chunk of 1: the end is never held
GREEDY = {"temperature": 0.0, "max_tokens": GEN, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    with tiny_llama_server(tmp_path_factory.mktemp("home"), "--stream-interval", str(INTERVAL)) as url:
        yield url


def _tokens_per_chunk(chunks) -> list[int]:
    return [len(c.choices[0].logprobs.tokens) for c in chunks if c.choices and c.choices[0].logprobs]


def test_completion_chunks_gather_the_interval(client, model):
    full = client.completions.create(model=model, prompt="one two three", **GREEDY).choices[0].text
    chunks = list(client.completions.create(model=model, prompt="one two three", stream=True, logprobs=0, **GREEDY))
    counts = _tokens_per_chunk(chunks)
    assert sum(counts) == GEN
    assert counts[0] >= 1 and all(n >= INTERVAL for n in counts[1:-1]), counts
    assert len(counts) <= 2 + (GEN - 1) // INTERVAL, counts
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_stream_text_unchanged(client, model):
    messages = [{"role": "user", "content": "hello there"}]
    full = client.chat.completions.create(model=model, messages=messages, **GREEDY).choices[0].message.content
    chunks = list(client.chat.completions.create(model=model, messages=messages, stream=True, **GREEDY))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) <= 2 + (GEN - 1) // INTERVAL


def test_ollama_generate_stream_text_unchanged(base_url, model):
    client = ollama.Client(host=base_url)
    options = {"temperature": 0.0, "num_predict": GEN}
    full = client.generate(model=model, prompt="one two three", options=options)["response"]
    parts = [p["response"] for p in client.generate(model=model, prompt="one two three", options=options, stream=True)]
    assert "".join(parts) == full
    assert len([p for p in parts if p]) <= 2 + (GEN - 1) // INTERVAL


@pytest.mark.parametrize("text", ["0", "-1", "1025", "x", "2.5"])
def test_bad_interval_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="--stream-interval"):
        stream_interval(text)


def test_interval_bounds_accepted():
    assert stream_interval("1") == 1 and stream_interval("1024") == 1024
