"""Hostile bodies on the Anthropic routes: bad or unknown content blocks, wrong roles for a
block, huge inputs. Each is a 400 in Anthropic's error shape naming the field, never a 500,
streamed or not, on /v1/messages and on count_tokens; the server answers throughout."""
from __future__ import annotations

import httpx
import pytest
from server_harness import tiny_llama_server


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    with tiny_llama_server(tmp_path_factory.mktemp("home")) as url:
        yield url


@pytest.fixture(scope="module")
def name(base_url) -> str:
    return httpx.get(base_url + "/v1/models").json()["data"][0]["id"]


def user(*blocks) -> list[dict]:
    return [{"role": "user", "content": list(blocks)}]


def assistant(*blocks) -> list[dict]:
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": list(blocks)}]


TOOL = {"name": "f", "input_schema": {"type": "object"}}
# (fields over a plain request, the field the 400 must name)
BAD = [
    ({"messages": user({"type": "foo", "text": "x"})}, "messages[0].content[0].type"),
    ({"messages": user("just a string")}, "messages.0.content"),
    ({"messages": user({"text": "no type"})}, "messages[0].content[0].type"),
    ({"messages": user({"type": "text"})}, "messages[0].content[0].text"),
    ({"messages": user({"type": "text", "text": 5})}, "messages[0].content[0].text"),
    ({"messages": user({"type": "image", "source": {"type": "base64", "data": "AA=="}})}, "messages[0].content[0].type"),
    ({"messages": user({"type": "tool_use", "id": "t", "name": "f", "input": {}})}, "messages[0].content[0].type"),
    ({"messages": assistant({"type": "tool_result", "tool_use_id": "t"})}, "messages[1].content[0].type"),
    ({"messages": assistant({"type": "tool_use", "id": "t", "name": "f", "input": [1]})}, "messages[1].content[0].input"),
    ({"messages": assistant({"type": "tool_use", "id": "t", "name": "", "input": {}})}, "messages[1].content[0].name"),
    ({"messages": assistant({"type": "tool_use", "name": "f", "input": {}})}, "messages[1].content[0].id"),
    ({"messages": assistant({"type": "thinking"})}, "messages[1].content[0].thinking"),
    ({"messages": user({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]})},
     "messages[0].content[0].content[0].type"),
    ({"messages": user({"type": "tool_result", "tool_use_id": "t", "content": 7})}, "messages[0].content[0].content"),
    ({"messages": user({"type": "tool_result", "tool_use_id": "t", "is_error": "yes"})}, "messages[0].content[0].is_error"),
    ({"messages": user({"type": "tool_result", "content": "x"})}, "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ({"messages": []}, "messages"),
    ({"system": [{"type": "image"}]}, "system[0].type"),
    ({"system": 5}, "system"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [TOOL, TOOL]}, "tools"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "g"}}, "tool_choice"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"thinking": {"type": "enabled", "budget_tokens": 4096}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"stop_sequences": ["x"] * 100}, "stop_sequences"),
    ({"stop_sequences": [""]}, "stop_sequences"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"messages": user(*[{"type": "text", "text": "x"}] * 5000)}, "messages.0.content"),
    ({"messages": user({"type": "text", "text": "word " * 150_000})}, "messages"),
]


def expect_400(r: httpx.Response, field: str) -> None:
    assert r.status_code == 400, r.text[:500]
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert field in body["error"]["message"], (field, body)


@pytest.mark.parametrize("over,field", BAD, ids=[f for _, f in BAD])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_bodies_are_400s_naming_the_field(base_url, name, over, field, stream):
    body = {"model": name, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "stream": stream, **over}
    expect_400(httpx.post(base_url + "/v1/messages", json=body, timeout=120), field)


@pytest.mark.parametrize("over,field", [(o, f) for o, f in BAD if not {"temperature", "top_k", "stop_sequences",
                                                                             "max_tokens", "thinking"} & o.keys()])
def test_count_tokens_refuses_the_same_bodies(base_url, name, over, field):
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], **over}
    expect_400(httpx.post(base_url + "/v1/messages/count_tokens", json=body, timeout=120), field)


def test_over_the_context_a_400_to_generate_but_counted(base_url, name):
    context = httpx.get(base_url + "/v1/models").json()["data"][0]["max_model_len"]
    messages = [{"role": "user", "content": "word " * (context + 10)}]
    r = httpx.post(base_url + "/v1/messages", json={"model": name, "max_tokens": 8, "messages": messages}, timeout=120)
    expect_400(r, "messages")
    r = httpx.post(base_url + "/v1/messages/count_tokens", json={"model": name, "messages": messages}, timeout=120)
    assert r.status_code == 200 and r.json()["input_tokens"] > context, r.text[:300]


def test_still_serving_after_hostile_bodies(base_url, name):
    for raw in (b"{", b"[]", b'{"model": 1}'):
        r = httpx.post(base_url + "/v1/messages", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
    body = {"model": name, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(base_url + "/v1/messages", json=body, timeout=120).json()["type"] == "message"
