"""Streamed tool-call arguments on all four APIs through the official clients, against a real
server on a random-weight tiny Llama given a tool template: the streamed fragments concatenated
equal the call the same request gives unstreamed, and come in more than one piece.

The model is made to write a given call: a JSON call under a JSON schema (Ollama's `format`,
the Responses `text.format`, Chat Completions' `response_format`) on a Llama-3 style template,
where a reply that is a JSON call is a call; a forced tool (Anthropic, Responses); and, on a
Qwen3-Coder style template, the exact XML text of a reply under a regex (vLLM's extra)."""
from __future__ import annotations

import json
import shutil

import anthropic
import httpx
import ollama
import openai
import pytest
from model_fixtures import fixture_model
from server_harness import running_server

# Templates of our own in each family's shape: detected as llama3_json and qwen3_xml.
LLAMA_TEMPLATE = (
    "{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nTools: {{ tools | tojson }}<|eot_id|>{% endif %}"
    "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
QWEN_XML_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }}\n{% endfor %}"
    "Call: <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]
CALL_SCHEMA = {"type": "object", "properties": {"name": {"const": "get_weather"}, "parameters": PARAMS},
               "required": ["name", "parameters"], "additionalProperties": False}
ASK = [{"role": "user", "content": "weather?"}]


def served(tmp_path_factory, template: str):
    model_dir = tmp_path_factory.mktemp("tools") / "model"
    shutil.copytree(fixture_model("tiny-llama3").hf_dir, model_dir)
    config_path = model_dir / "tokenizer_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "chat_template": template}))
    return running_server(tmp_path_factory.mktemp("home"), "--model", str(model_dir), "--max-model-len", "1024")


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    with served(tmp_path_factory, LLAMA_TEMPLATE) as url:
        yield url


@pytest.fixture(scope="module")
def model(base_url) -> str:
    return httpx.get(base_url + "/v1/models").json()["data"][0]["id"]


def chat_fragments(stream) -> tuple[dict[int, dict], str | None]:
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "parts": []})
                call["id"] = d.id or call["id"]
                if d.function:
                    call["name"] += d.function.name or ""
                    if d.function.arguments:
                        call["parts"].append(d.function.arguments)
    return calls, finish


def test_openai_chat_streams_a_calls_arguments_in_fragments(base_url, model):
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    args = dict(model=model, messages=ASK, tools=TOOLS, temperature=0.0, max_tokens=120,
                response_format={"type": "json_schema", "json_schema": {"name": "call", "schema": CALL_SCHEMA}})
    whole = client.chat.completions.create(**args).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    (call,) = whole.message.tool_calls
    calls, finish = chat_fragments(client.chat.completions.create(**args, stream=True))
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert "".join(calls[0]["parts"]) == call.function.arguments and len(calls[0]["parts"]) > 2


def test_responses_streams_function_call_arguments_deltas(base_url, model):
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    for extra in ({"text": {"format": {"type": "json_schema", "name": "call", "schema": CALL_SCHEMA}}},
                  {"tool_choice": {"type": "function", "name": "get_weather"}}):
        args = dict(model=model, input="weather?", temperature=0.0, max_output_tokens=120,
                    tools=[{"type": "function", "name": "get_weather", "parameters": PARAMS}], **extra)
        whole = client.responses.create(**args)
        (item,) = [o for o in whole.output if o.type == "function_call"]
        events = list(client.responses.create(**args, stream=True))
        deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert "".join(deltas) == done.arguments == item.arguments and len(deltas) > 2, extra
        added = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
        assert added[0].item.arguments == "" and added[0].item.name == "get_weather"
        assert [e.type for e in events].index(added[0].type) < [e.type for e in events].index(
            "response.function_call_arguments.delta")


def test_anthropic_streams_input_json_deltas(base_url, model):
    client = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    args = dict(model=model, messages=ASK, max_tokens=120, extra_body={"temperature": 0.0},
                tools=[{"name": "get_weather", "input_schema": PARAMS}], tool_choice={"type": "tool", "name": "get_weather"})
    whole = client.messages.create(**args)
    (use,) = [b for b in whole.content if b.type == "tool_use"]
    with client.messages.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_message()
    parts = [e.delta.partial_json for e in events if e.type == "content_block_delta"
             and e.delta.type == "input_json_delta"]
    assert json.loads("".join(parts)) == use.input == final.content[-1].input and len(parts) > 2
    assert final.stop_reason == "tool_use"


def test_ollama_sends_a_call_in_its_own_chunk_once_whole(base_url, model):
    client = ollama.Client(host=base_url, timeout=120)
    args = dict(model=model, messages=ASK, tools=TOOLS, format=CALL_SCHEMA, options={"temperature": 0, "num_predict": 120})
    whole = client.chat(**args)
    (call,) = whole.message.tool_calls
    chunks = list(client.chat(**args, stream=True))
    with_calls = [i for i, c in enumerate(chunks) if c.message.tool_calls]
    assert len(with_calls) == 1 and with_calls[0] < len(chunks) - 1  # before the final object
    (streamed,) = chunks[with_calls[0]].message.tool_calls
    assert (streamed.function.name, streamed.function.arguments) == (call.function.name, call.function.arguments)
    assert "".join(c.message.content for c in chunks) == whole.message.content == ""


def rust_regex_literal(text: str) -> str:
    return "".join("\\n" if ch == "\n" else "\\" + ch if ch in "\\.+*?()|[]{}^$#&-~" else ch for ch in text)


XML_REPLY = ("Looking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\n</parameter>\n"
             "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def test_qwen_xml_reply_streams_its_arguments(tmp_path_factory):
    with served(tmp_path_factory, QWEN_XML_TEMPLATE) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        name = client.models.list().data[0].id
        args = dict(model=name, messages=ASK, tools=TOOLS, temperature=0.0, max_tokens=200,
                    extra_body={"structured_outputs": {"regex": rust_regex_literal(XML_REPLY)}})
        whole = client.chat.completions.create(**args).choices[0]
        assert whole.message.content == "Looking.\n" and whole.finish_reason == "tool_calls"
        (call,) = whole.message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "San Jose", "days": 3})
        calls, finish = chat_fragments(client.chat.completions.create(**args, stream=True))
        assert finish == "tool_calls" and "".join(calls[0]["parts"]) == call.function.arguments
        assert len(calls[0]["parts"]) > 2
        off = dict(args, parallel_tool_calls=False)
        assert len(client.chat.completions.create(**off).choices[0].message.tool_calls) == 1
