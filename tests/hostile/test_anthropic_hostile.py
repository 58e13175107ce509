"""Hostile bodies on the Anthropic routes: bad or unknown content blocks, wrong roles for a
block, huge inputs. Each is a 400 in Anthropic's error shape naming the field, never a 500,
streamed or not, on /v1/messages and on count_tokens; the server answers throughout. And
schemathesis over the routes' OpenAPI description (content blocks, tools and all), for the
served model: never a 5xx, nor an api_error inside a stream."""
from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
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


def _served(body: object, name: str, mode: GenerationMode) -> None:
    """The served model (a generated name is a 404 before anything else is read), few tokens
    (in positive mode an integral float too: 4.0 is no integer to the strict schema)."""
    if isinstance(body, dict):
        body["model"] = name
        tokens = body.get("max_tokens")
        if isinstance(tokens, int) and tokens > 4 or mode is GenerationMode.POSITIVE and isinstance(tokens, float):
            body["max_tokens"] = 4


def _server_fault(response) -> str | None:
    kind = (response.headers.get("content-type") or [""])[0]
    if response.status_code >= 500 or not kind.startswith(("application/json", "text/event-stream")):
        return f"{response.status_code} {response.text[:300]}"
    if response.status_code >= 400 and response.json().get("type") != "error":
        return f"not Anthropic's error shape: {response.text[:300]}"
    if kind.startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data: ") and '"error"' in line and json.loads(line[6:])["error"]["type"] == "api_error":
                return f"an api_error in the stream: {line[:300]}"
    return None


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schemathesis_over_the_anthropic_routes_finds_no_server_error(base_url, name, mode):
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json").include(path_regex=r"^/v1/messages")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert sorted(op.label for op in operations) == ["POST /v1/messages", "POST /v1/messages/count_tokens"]
    failures: list[str] = []
    for op in operations:

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case) -> None:
            _served(case.body, name, mode)
            fault = _server_fault(case.call(timeout=60))
            if fault:
                failures.append(f"{op.label} {case.body!r:.400} -> {fault}")

        check()
    assert not failures, "\n".join(failures[:10])
