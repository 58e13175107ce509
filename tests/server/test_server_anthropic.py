"""The Anthropic Messages API (/v1/messages, count_tokens) through the official anthropic client
against a real server on a random-weight model, behind an API key (sent as x-api-key or as a
Bearer token). A random model writes no calls of its own: the tool tests force one."""
from __future__ import annotations

import anthropic
import httpx
import jsonschema
import pytest
from model_fixtures import fixture_model
from server_harness import running_server

KEY = "sk-ant-test"
ASK = [{"role": "user", "content": "hi"}]
# This client version has no sampling arguments; the server still takes them.
GREEDY = {"extra_body": {"temperature": 0.0}, "max_tokens": 16}
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                   "unit": {"enum": ["C", "F"]}},
                  "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER_SCHEMA}
FORCED = {"type": "tool", "name": "get_weather"}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    gguf = str(fixture_model("tiny-llama3").gguf_path)  # room for a tool prompt at 1024 positions
    with running_server(tmp_path_factory.mktemp("home"), "--model", gguf, "--max-model-len", "1024",
                        api_key=KEY) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(base_url) -> str:
    r = httpx.get(base_url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    return r.json()["data"][0]["id"]


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_create_gives_a_message_with_usage(client, model):
    r = client.messages.create(model=model, messages=ASK, system="Be brief.", metadata={"user_id": "u1"}, **GREEDY)
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant" and r.model == model
    assert r.content and r.content[0].type == "text" and text_of(r)
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    assert 0 < r.usage.output_tokens <= 16 and r.usage.cache_creation_input_tokens == 0
    counted = client.messages.count_tokens(model=model, messages=ASK, system="Be brief.").input_tokens
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == counted


def test_streamed_text_deltas_join_to_the_whole_text(client, model):
    whole = client.messages.create(model=model, messages=ASK, **GREEDY)
    with client.messages.stream(model=model, messages=ASK, **GREEDY) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(deltas) == text_of(whole) == text_of(final) and len(deltas) > 1
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    kinds = [e.type for e in client.messages.create(model=model, messages=ASK, stream=True, **GREEDY)]
    assert kinds[:2] == ["message_start", "content_block_start"]  # the client drops pings
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}


def test_stream_sends_event_lines_named_as_their_data(base_url, model):
    body = {"model": model, "messages": ASK, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", base_url + "/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines[0::2]]
    assert all(line.startswith("event: ") for line in lines[0::2]) and names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert all(f'"type":"{name}"' in data for name, data in zip(names, lines[1::2]))


def test_stop_sequence_ends_the_text_and_is_named(client, model):
    text = text_of(client.messages.create(model=model, messages=ASK, **GREEDY))
    stop = next(text[i:i + 3] for i in range(2, len(text) - 3) if text[i:i + 3].strip())
    r = client.messages.create(model=model, messages=ASK, stop_sequences=[stop], **GREEDY)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert text_of(r) == text[:text.index(stop)]


def test_forced_tool_use_then_tool_result_then_an_answer(client, model):
    r = client.messages.create(model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
                               tools=[WEATHER], tool_choice=FORCED, extra_body={"temperature": 0.0}, max_tokens=128)
    assert r.stop_reason == "tool_use"
    use = next(b for b in r.content if b.type == "tool_use")
    assert use.id.startswith("toolu_") and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER_SCHEMA)
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": [{"type": "text", "text": "18"}]},
                                            {"type": "text", "text": "And tomorrow?"}]}]
    answer = client.messages.create(model=model, messages=history, tools=[WEATHER], **GREEDY)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.content
    # The call and its result are in the prompt: it outgrows the first one by more than the question.
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens > r.usage.input_tokens + 10
    plain = client.messages.create(model=model, messages=history, tools=[WEATHER], tool_choice={"type": "none"},
                                   **GREEDY)
    assert plain.stop_reason in ("end_turn", "max_tokens") and text_of(plain)
    failed = [*history[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use.id, "content": "no such city", "is_error": True}]}]
    assert client.messages.create(model=model, messages=failed, tools=[WEATHER], **GREEDY).content is not None


def test_forced_tool_use_streamed_as_input_json(client, model):
    ask = [{"role": "user", "content": "Weather?"}]
    with client.messages.stream(model=model, messages=ask, tools=[WEATHER], tool_choice=FORCED,
                                extra_body={"temperature": 0.0}, max_tokens=128) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
    use = next(b for b in final.content if b.type == "tool_use")
    jsonschema.validate(use.input, WEATHER_SCHEMA)
    assert final.stop_reason == "tool_use"


def test_count_tokens_equals_the_chat_prompt_tokens(client, model, base_url):
    messages = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"},
                {"role": "user", "content": [{"type": "text", "text": "how "}, {"type": "text", "text": "are you"}]}]
    counted = client.messages.count_tokens(model=model, messages=messages, system=[{"type": "text", "text": "Be kind."}])
    chat = [{"role": "system", "content": "Be kind."}, *messages[:2], {"role": "user", "content": "how are you"}]
    r = httpx.post(base_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=120,
                   json={"model": model, "messages": chat, "max_tokens": 1})
    assert counted.input_tokens == r.json()["usage"]["prompt_tokens"] > 10


def test_errors_come_in_anthropics_shape(base_url, client, model):
    r = httpx.post(base_url + "/v1/messages", headers={"x-api-key": KEY}, json={"model": model, "messages": ASK})
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="no-such-model", messages=ASK, max_tokens=4)
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=model, messages=[{"role": "user", "content": [{"type": "image"}]}], max_tokens=4)
    assert "messages[0].content[0].type" in e.value.body["error"]["message"]
    chat = httpx.post(base_url + "/v1/chat/completions", headers={"x-api-key": KEY}, json={"model": model})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"  # OpenAI's shape stays


def test_api_key_as_x_api_key_or_bearer(base_url, model):
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=base_url, api_key="wrong", max_retries=0).messages.create(
            model=model, messages=ASK, max_tokens=2)
    assert e.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                       "message": "missing or invalid API key"}}
    body = {"model": model, "messages": ASK, "max_tokens": 2}
    bearer = httpx.post(base_url + "/v1/messages", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    assert bearer.status_code == 200 and bearer.json()["type"] == "message"
    assert httpx.post(base_url + "/v1/messages", json=body, timeout=120).status_code == 401
    # This client version sends its key as a Bearer token; earlier ones and Claude Code send x-api-key.
    keyed = httpx.post(base_url + "/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=120)
    assert keyed.status_code == 200 and keyed.json()["type"] == "message"


def test_beta_query_and_anthropic_headers_are_accepted(client, model, base_url):
    r = client.beta.messages.create(model=model, messages=ASK, max_tokens=2, betas=["interleaved-thinking-2025-05-14"])
    assert r.type == "message" and r.usage.output_tokens <= 2
    assert httpx.head(base_url + "/", headers={"x-api-key": KEY}).status_code == 200
