"""Issue 51: work a request decides is bounded, and a request past a bound is a 400 naming it;
the server answers others throughout. One server for the module (a tiny random Llama)."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_harness import tiny_llama_server
from slow_grammars import slow_tools

BUDGET_S = 3.0  # the server's grammar-check budget here (10 s by default)


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLXR_GRAMMAR_CHECK_BUDGET_S", str(BUDGET_S))
        with tiny_llama_server(tmp_path_factory.mktemp("home")) as url:
            yield url


@pytest.fixture(scope="module")
def name(base_url) -> str:
    return httpx.get(base_url + "/v1/models").json()["data"][0]["id"]


def error_text(r: httpx.Response) -> str:
    err = r.json()["error"]
    return err["message"] if isinstance(err, dict) else err


def expect_400(r: httpx.Response, *words: str) -> None:
    assert r.status_code == 400, r.text[:500]
    for word in words:
        assert word in error_text(r), (word, r.text[:500])


def plain_chat(base_url: str, name: str) -> float:
    start = time.monotonic()
    r = httpx.post(base_url + "/v1/chat/completions", timeout=120,
                   json={"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200, r.text
    return time.monotonic() - start


# --- T5: forced tool calls' grammar checks: a tool cap, one budget, stopped when spent -------

def test_more_tools_than_the_cap_is_a_400_naming_it(base_url, name):
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(129)]
    r = httpx.post(base_url + "/v1/chat/completions", timeout=60, json={
        "model": name, "messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": "required"})
    expect_400(r, "tools", "at most 128", "MAX_TOOLS")


SLOW_TOOLS = slow_tools(12)  # ~30 s of checks a request before the fix
FORCED = [("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": SLOW_TOOLS}),
          ("/v1/responses", {"input": "x", "tools": [{"type": "function", **t["function"]} for t in SLOW_TOOLS]})]


@pytest.mark.parametrize("route,body", FORCED, ids=["chat", "responses"])
def test_slow_forced_call_checks_stop_at_the_budget_and_plain_chats_do_not_wait(base_url, name, route, body):
    body = {**body, "model": name, "tool_choice": "required"}
    with ThreadPoolExecutor(4) as pool:
        start = time.monotonic()
        hostile = [pool.submit(httpx.post, base_url + route, json=body, timeout=300) for _ in range(4)]
        time.sleep(0.3)
        waits = []
        while not all(f.done() for f in hostile):
            waits.append(plain_chat(base_url, name))
        answered = time.monotonic() - start
    for f in hostile:
        expect_400(f.result(), "did not finish within 3 s", "GRAMMAR_CHECK_BUDGET_S")
    assert answered < BUDGET_S + 4, answered
    assert waits and max(waits) < 2.0, waits  # before: a plain chat waited for the prompt pool's checks
