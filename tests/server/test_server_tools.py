"""Tool calling against a real `mlxr serve` (random-weight tiny Llama, whose template knows no
tools, so the generic <tool_call> format applies) through the official openai and ollama
clients. tool_choice required / named decode under the call's JSON schema: those tests need
the grammar engine (the structured branch) to pass."""
from __future__ import annotations

import json

import jsonschema
import ollama
import openai
import pytest
from pydantic import BaseModel, Field
from model_fixtures import fixture_model
from server_harness import running_server

GREEDY = {"temperature": 0.0, "max_tokens": 128}


def fn(name: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


TOOLS = [
    fn("get_weather", {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["C", "F"]}}, ["city", "unit"]),
    fn("add", {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": -9, "maximum": 9}}, ["a", "b"]),
    fn("tag", {"tags": {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1, "maxItems": 3}}, ["tags"]),
    fn("flag", {"on": {"type": "boolean"}}, ["on"]),
    fn("nothing", {}, []),
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "use a tool"}]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris", "unit": "C"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18"},
]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    # 512 positions, served at 1024 (random weights do not mind): room for a pydantic tool's schema
    gguf = str(fixture_model("tiny-llama3").gguf_path)
    with running_server(tmp_path_factory.mktemp("home"), "--model", gguf, "--max-model-len", "1024") as url:
        yield url



def check_calls(calls, names=None):
    assert calls, "no tool calls"
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert names is None or c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])


def reassemble(chunks) -> tuple[dict, str | None, str]:
    """Streamed tool-call deltas folded by index, as a client does."""
    calls: dict[int, dict] = {}
    finish, content = None, ""
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = d.id or call["id"]
                if d.function:
                    call["name"] += d.function.name or ""
                    call["arguments"] += d.function.arguments or ""
    return calls, finish, content


@pytest.mark.parametrize("tool", [t["function"]["name"] for t in TOOLS])
def test_named_function_gives_a_valid_call_streamed_or_not(client, model, tool):
    choice = {"type": "function", "function": {"name": tool}}
    tools = [t for t in TOOLS if t["function"]["name"] == tool]  # one at a time: the context is 512
    r = client.chat.completions.create(model=model, messages=ASK, tools=tools, tool_choice=choice, seed=3, **GREEDY)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    check_calls(c.message.tool_calls, {tool})
    assert len(c.message.tool_calls) == 1
    calls, finish, content = reassemble(client.chat.completions.create(
        model=model, messages=ASK, tools=tools, tool_choice=choice, seed=3, stream=True, **GREEDY))
    assert finish == "tool_calls" and content == ""
    assert [(v["name"], json.loads(v["arguments"])) for v in calls.values()] == \
        [(tool, json.loads(c.message.tool_calls[0].function.arguments))]
    assert calls[0]["id"].startswith("call_")


@pytest.mark.parametrize("seed", range(4))
def test_required_gives_valid_calls(client, model, seed):
    r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS[3:], tool_choice="required",
                                       temperature=1.0, seed=seed, max_tokens=160,
                                       parallel_tool_calls=False)  # one call: a random model never stops a list
    assert r.choices[0].finish_reason == "tool_calls"
    check_calls(r.choices[0].message.tool_calls)
    assert len(r.choices[0].message.tool_calls) == 1


def test_auto_with_a_random_model_never_fails(client, model):
    for stream in (False, True):
        r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS[:1], stream=stream, **GREEDY)
        if stream:
            calls, finish, _ = reassemble(r)
            assert finish in ("stop", "length", "tool_calls")
        else:
            assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
            if r.choices[0].message.tool_calls:
                check_calls(r.choices[0].message.tool_calls)


def test_multi_turn_with_tool_results(client, model):
    r = client.chat.completions.create(model=model, messages=CONVERSATION, tools=TOOLS[:1], max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    r = client.chat.completions.create(model=model, messages=CONVERSATION, max_tokens=4)  # no tools sent now
    assert r.usage.prompt_tokens > 20


def test_bad_tool_choice_is_a_400(client, model):
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        client.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="needs tools"):
        client.chat.completions.create(model=model, messages=ASK, tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="chat_template_kwargs"):
        client.chat.completions.create(model=model, messages=ASK, extra_body={"chat_template_kwargs": {"messages": 1}})


def test_ollama_tools_and_tool_results(base_url, model):
    client = ollama.Client(host=base_url, timeout=120)
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}]},
                {"role": "tool", "content": "18", "tool_name": "get_weather"}]
    r = client.chat(model=model, messages=messages, tools=TOOLS[:1], options={"temperature": 0, "num_predict": 8})
    assert r.done and r.message.role == "assistant"
    streamed = list(client.chat(model=model, messages=messages, tools=TOOLS[:1], stream=True,
                                options={"temperature": 0, "num_predict": 8}))
    assert "".join(c.message.content or "" for c in streamed) == r.message.content


def test_ollama_think_needs_a_thinking_template(base_url, model):
    client = ollama.Client(host=base_url, timeout=120)
    with pytest.raises(ollama.ResponseError, match="does not support thinking"):
        client.chat(model=model, messages=ASK, think=True)
    r = client.chat(model=model, messages=ASK, think=False, options={"num_predict": 2})
    assert r.done and not r.message.thinking


LOOSE_TOOL = {"type": "function", "function": {"name": "note", "parameters": {
    "type": "object", "properties": {"title": {"type": "string", "maxLength": 6}, "n": {"enum": [1, 2, 3]}}}}}


def strict_calls(client, model, tool: dict, seeds) -> list[bool]:
    """Per seed: did the named call's arguments carry exactly the schema's properties?"""
    choice = {"type": "function", "function": {"name": "note"}}
    shapes = []
    for seed in seeds:
        r = client.chat.completions.create(model=model, messages=ASK, tools=[tool], tool_choice=choice, seed=seed,
                                           temperature=1.0, max_tokens=128)
        calls = r.choices[0].message.tool_calls or []
        try:
            shapes.append(len(calls) == 1 and set(json.loads(calls[0].function.arguments)) == {"title", "n"})
        except ValueError:
            shapes.append(False)
    return shapes


def test_strict_function_tool_requires_every_parameter_and_nothing_else(client, model):
    strict = {**LOOSE_TOOL, "function": {**LOOSE_TOOL["function"], "strict": True}}
    assert all(strict_calls(client, model, strict, range(5)))
    assert not all(strict_calls(client, model, LOOSE_TOOL, range(5)))  # without strict: optional, open


class Place(BaseModel):
    city: str = Field(max_length=8)
    zip: int = Field(ge=0, le=99)


class Trip(BaseModel):
    to: Place
    stops: list[Place] = Field(max_length=2)


# What the official client makes of nested models: the parameters $ref "#/$defs/Place".
NESTED = openai.pydantic_function_tool(Trip)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "Trip"}}])
def test_forced_call_with_nested_pydantic_models_follows_their_defs(client, model, choice):
    """The parameters' $refs resolve against the parameters, not the call schema around them
    (a 400 "Pointer '/$defs/Place' does not exist" before); the random model's call is valid
    because the grammar made it so."""
    assert "$defs" in NESTED["function"]["parameters"]
    for seed in range(3):
        r = client.chat.completions.create(model=model, messages=ASK, tools=[NESTED], tool_choice=choice,
                                           seed=seed, temperature=1.0, max_tokens=200)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, c
        call = c.message.tool_calls[0].function
        assert call.name == "Trip"
        jsonschema.validate(json.loads(call.arguments), NESTED["function"]["parameters"])
        Trip.model_validate_json(call.arguments)


# Parameters written for draft 4 (older generators' output): their resource name is `id`.
DRAFT4 = {"type": "function", "function": {"name": "set_alarm", "parameters": {
    "$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
    "definitions": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
    "properties": {"at": {"$ref": "#/definitions/hour"}, "label": {"type": "string", "maxLength": 8}},
    "required": ["at", "label"], "additionalProperties": False}}}


def test_forced_call_with_draft4_parameters_follows_their_definitions(client, model):
    """A draft-4 schema's $refs resolve against the parameters too (a 400 "Pointer
    '/definitions/hour' does not exist" before: draft 4 names a resource by `id`, not `$id`)."""
    for seed in range(3):
        r = client.chat.completions.create(model=model, messages=ASK, tools=[DRAFT4], tool_choice="required",
                                           seed=seed, temperature=1.0, max_tokens=100)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, c
        jsonschema.Draft4Validator(DRAFT4["function"]["parameters"]).validate(
            json.loads(c.message.tool_calls[0].function.arguments))


def test_forced_call_whose_parameters_never_finish_is_a_400_naming_the_tool(client, model):
    tools = [TOOLS[3], {"type": "function", "function": {"name": "loop", "parameters": {"$ref": "#"}}},
             {"type": "function", "function": {"name": "knot", "parameters": {
                 "type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}}}]
    for choice, index in (("required", 1), ({"type": "function", "function": {"name": "loop"}}, 1),
                          ({"type": "function", "function": {"name": "knot"}}, 2)):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=ASK, tools=tools, tool_choice=choice, max_tokens=8)
        assert e.value.body["param"] == f"tools[{index}].function.parameters", e.value.body
        assert "grammar" in e.value.body["message"]
    r = client.chat.completions.create(model=model, messages=ASK, tools=tools[:1], tool_choice="required",
                                       seed=1, **GREEDY)  # and the server still serves
    assert r.choices[0].finish_reason == "tool_calls"
