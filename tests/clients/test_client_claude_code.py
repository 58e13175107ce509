"""A Claude-Code-shaped session replayed against the server's Anthropic API: the requests in
claude_code_session.jsonl are written from Anthropic's API reference and Claude Code's
documented behaviour (ANTHROPIC_BASE_URL at a local server, its model names set to the local
model): a HEAD / connectivity check, `?beta=true` on every Messages call, anthropic-version,
anthropic-beta, x-api-key and x-app headers, the system prompt as text blocks with
cache_control, fourteen tools whose input_schema declare draft 7, metadata.user_id, streamed
turns carrying tool_use / tool_result history (an is_error result among them), thinking with a
budget, and count_tokens. Each reply must be what the client parses."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from client_server import MODEL, tool_template_server

SESSION = [json.loads(line) for line in (Path(__file__).parent / "claude_code_session.jsonl").read_text().splitlines()]
KEY = "sk-local"  # the session's x-api-key


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> Iterator[str]:
    # The tools alone are some 5,000 tokens of this tiny tokenizer's: room for them.
    with tool_template_server(tmp_path_factory.mktemp("claude-code"), "--max-model-len", "8192",
                              api_key=KEY) as base_url:
        yield base_url


def send(url: str, step: dict) -> httpx.Response:
    body = json.loads(json.dumps(step.get("body")).replace('"MODEL"', json.dumps(MODEL))) if "body" in step else None
    return httpx.request(step["method"], url + step["path"], headers=step["headers"], json=body, timeout=300)


def events_of(response: httpx.Response) -> list[tuple[str, dict]]:
    out = []
    for block in response.text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def check_stream(events: list[tuple[str, dict]]) -> dict:
    """The event grammar of a streamed Message; returns message_start's usage joined with the final one."""
    names = [name for name, _ in events if name != "ping"]
    assert all(data["type"] == name for name, data in events)
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    opened = [d["index"] for n, d in events if n == "content_block_start"]
    assert opened == list(range(len(opened))) == [d["index"] for n, d in events if n == "content_block_stop"]
    for name, data in events:
        if name == "content_block_delta":
            assert data["delta"]["type"] in ("text_delta", "thinking_delta", "signature_delta", "input_json_delta")
    final = events[[n for n, _ in events].index("message_delta")][1]
    assert final["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use", "stop_sequence")
    return {**events[0][1]["message"]["usage"], **final["usage"]}


def test_claude_code_session_replays(url):
    usages, counted = {}, None
    for step in SESSION:
        r = send(url, step)
        assert r.status_code == 200, (step["name"], r.text[:500])
        if step["expect"] == "message":
            assert r.json()["type"] == "message" and r.json()["usage"]["output_tokens"] <= step["body"]["max_tokens"]
        elif step["expect"] == "count":
            counted = r.json()["input_tokens"]
        elif step["expect"] == "stream":
            assert r.headers["content-type"].startswith("text/event-stream"), step["name"]
            usages[step["name"]] = check_stream(events_of(r))
            assert usages[step["name"]]["output_tokens"] <= step["body"]["max_tokens"]
    first = usages["first turn"]
    assert counted == first["input_tokens"] + first.get("cache_read_input_tokens", 0)
    # The second turn repeats the first's system prompt and tools: read from the prefix cache.
    assert usages["after a tool result"]["cache_read_input_tokens"] > 0.9 * counted


def test_without_the_key_the_session_is_refused_in_anthropics_shape(url):
    step = next(s for s in SESSION if s["name"] == "first turn")
    r = send(url, {**step, "headers": {k: v for k, v in step["headers"].items() if k != "x-api-key"}})
    assert r.status_code == 401 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "authentication_error"
