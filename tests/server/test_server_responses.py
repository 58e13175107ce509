"""POST /v1/responses through the official openai client (`responses.create`, streaming and
not, and `responses.stream`) against a real server on a random-weight model. The json_schema
and forced-function tests need the grammar engine (the structured branch)."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from model_fixtures import fixture_model
from server_harness import running_server

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                           "sunny": {"type": "boolean"}},
          "required": ["city", "sunny"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> openai.OpenAI:
    gguf = str(fixture_model("tiny-llama3").gguf_path)
    with running_server(tmp_path_factory.mktemp("home"), "--model", gguf) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def test_text_input_streamed_and_not(client, model):
    r = client.responses.create(model=model, input="hello", max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].type == "message" and r.usage.output_tokens == 8
    events = list(client.responses.create(model=model, input="hello", max_output_tokens=8, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text


def test_message_list_input_with_instructions_and_tool_results(client, model):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Rome"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
    r = client.responses.create(model=model, input=items, instructions="Be brief.", tools=[WEATHER],
                                max_output_tokens=4)
    assert r.status in ("completed", "incomplete") and r.usage.input_tokens > 20


def test_json_schema_streamed_through_responses_stream(client, model):
    fmt = {"format": {"type": "json_schema", "name": "w", "schema": SCHEMA, "strict": True}}
    r = client.responses.create(model=model, input="weather as JSON", text=fmt, max_output_tokens=120, temperature=0)
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    with client.responses.stream(model=model, input="weather as JSON", text=fmt, max_output_tokens=120,
                                 temperature=0) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == r.output_text


@pytest.mark.parametrize("stream", [False, True])
def test_function_tool_gives_a_function_call_item(client, model, stream):
    kw = dict(model=model, input="weather in Rome?", tools=[WEATHER], tool_choice="required",
              parallel_tool_calls=False, max_output_tokens=80)
    if stream:
        events = list(client.responses.create(stream=True, **kw))
        assert "response.function_call_arguments.done" in [e.type for e in events]
        output = events[-1].response.output
    else:
        output = client.responses.create(**kw).output
    calls = [o for o in output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])


def test_stateful_and_unsupported_requests_are_400s(client, model):
    with pytest.raises(openai.BadRequestError, match="stateless"):
        client.responses.create(model=model, input="hi", previous_response_id="resp_1")
    with pytest.raises(openai.BadRequestError, match="stateless"):
        client.responses.create(model=model, input="hi", store=True)
    with pytest.raises(openai.BadRequestError, match="only function tools"):
        client.responses.create(model=model, input="hi", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="input_image"):
        client.responses.create(model=model, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x"}]}])
