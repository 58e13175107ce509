"""Reasoning end to end: a random-weight model given a thinking template (Qwen3-Thinking /
DeepSeek-R1 style: the generation prompt opens `<think>`, `enable_thinking=false` closes it
empty), so everything it writes is reasoning unless thinking is turned off. Through the
official openai (reasoning_content, streamed too) and ollama (think, message.thinking)
clients."""
from __future__ import annotations

import json
import shutil

import ollama
import openai
import pytest
from model_fixtures import fixture_model
from server_harness import running_server

THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}")
ASK = [{"role": "user", "content": "hi"}]
GREEDY = {"temperature": 0.0, "max_tokens": 12}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("thinker") / "model"
    shutil.copytree(fixture_model("tiny-llama3").hf_dir, model_dir)
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": THINKING_TEMPLATE}))
    with running_server(tmp_path_factory.mktemp("home"), "--model", str(model_dir)) as url:
        yield url



def raw_text(client, model, thinking: bool) -> str:
    """What the model writes, through /v1/completions on the same rendered prompt."""
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" + (
        "<think>\n" if thinking else "<think>\n\n</think>\n\n")
    return client.completions.create(model=model, prompt=prompt, **GREEDY).choices[0].text


def test_reasoning_content_split_streamed_and_not(client, model):
    m = client.chat.completions.create(model=model, messages=ASK, **GREEDY).choices[0].message
    expected = raw_text(client, model, thinking=True)
    assert m.reasoning_content == expected.split("</think>")[0] and expected
    chunks = list(client.chat.completions.create(model=model, messages=ASK, stream=True, **GREEDY))
    streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    assert streamed == m.reasoning_content
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (m.content or "")


def test_thinking_off_through_the_template(client, model):
    for extra in ({"reasoning_effort": "none"}, {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}):
        m = client.chat.completions.create(model=model, messages=ASK, **extra, **GREEDY).choices[0].message
        assert not getattr(m, "reasoning_content", None)
        assert m.content == raw_text(client, model, thinking=False)


def test_ollama_think(base_url, model):
    client = ollama.Client(host=base_url, timeout=120)
    options = {"temperature": 0, "num_predict": 12}
    on = client.chat(model=model, messages=ASK, think=True, options=options)
    assert on.message.thinking and on.message.thinking == raw_text(openai_client(base_url), model, True).split("</think>")[0]
    streamed = list(client.chat(model=model, messages=ASK, think=True, options=options, stream=True))
    assert "".join(c.message.thinking or "" for c in streamed) == on.message.thinking
    off = client.chat(model=model, messages=ASK, think=False, options=options)
    assert not off.message.thinking and off.message.content


def openai_client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


PING = {"type": "function", "function": {"name": "ping", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"],
    "additionalProperties": False}}}


def test_a_forced_tool_call_starts_after_the_reasoning(client, model):
    """The call's grammar applies once the reasoning block ends: this model never closes it, so
    its whole reply is free reasoning (no JSON in sight); with thinking off, the call at once."""
    thinking = client.chat.completions.create(model=model, messages=ASK, tools=[PING], tool_choice="required",
                                              parallel_tool_calls=False, temperature=0, max_tokens=24).choices[0]
    assert thinking.finish_reason == "length" and not thinking.message.tool_calls
    reasoning = thinking.message.reasoning_content
    assert reasoning and not reasoning.startswith('{"')  # not the call: the grammar waits for `</think>`
    c = client.chat.completions.create(model=model, messages=ASK, tools=[PING], tool_choice="required",
                                       parallel_tool_calls=False, temperature=0, max_tokens=60,
                                       reasoning_effort="none").choices[0]
    assert c.finish_reason == "tool_calls" and not getattr(c.message, "reasoning_content", None)
    assert c.message.tool_calls[0].function.name == "ping"


def test_responses_api_reasoning_item(client, model):
    r = client.responses.create(model=model, input="hi", max_output_tokens=12, temperature=0)
    assert [o.type for o in r.output] == ["reasoning"]
    expected = raw_text(client, model, thinking=True).split("</think>")[0]
    assert r.output[0].content[0].text == expected
    events = list(client.responses.create(model=model, input="hi", max_output_tokens=12, temperature=0, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == expected
    assert events[-1].response.output[0].type == "reasoning"


def test_ollama_format_applies_after_the_thinking(base_url, model):
    client = ollama.Client(host=base_url, timeout=120)
    schema = PING["function"]["parameters"]
    options = {"temperature": 0, "num_predict": 16}
    on = client.chat(model=model, messages=ASK, think=True, format=schema, options=options)
    assert on.message.thinking and not on.message.content and on.done_reason == "length"
    off = client.chat(model=model, messages=ASK, think=False, format=schema, options={**options, "num_predict": 40})
    assert not off.message.thinking and json.loads(off.message.content)["n"] in range(10)
