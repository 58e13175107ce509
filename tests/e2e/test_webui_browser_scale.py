"""The web UI against a server with an API key: it asks for the key and sends it on every call;
and it stays responsive with 500 stored conversations and a 2,000-line log tail."""
from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from playwright.sync_api import expect
from server_harness import tiny_llama_server
from test_webui_browser import SHORT_REPLY, browser, open_page, send, shots  # noqa: F401 - fixtures

KEY = "browser-scale-key"
UNAUTHORIZED = ("401",)  # the browser logs the first, keyless calls' 401 responses


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with tiny_llama_server(tmp_path_factory.mktemp("webui-key"), api_key=KEY) as url:
        yield url


def test_with_an_api_key_the_ui_asks_for_it_and_sends_it_on_every_call(browser, server, shots):  # noqa: F811
    context, page, errors = open_page(browser, server + "/ui/#/chat", {"mlxr.sampling": SHORT_REPLY})
    api_calls: list[tuple[str, str | None]] = []
    page.on("request", lambda r: api_calls.append((r.url, r.headers.get("authorization")))
            if "/api/" in r.url or "/admin/" in r.url else None)
    dialog = page.get_by_test_id("key-dialog")
    expect(dialog).to_be_visible()
    page.screenshot(path=shots / "api-key.png")
    page.get_by_test_id("key-input").fill(KEY)
    page.get_by_test_id("key-save").click()
    expect(dialog).to_have_count(0)
    expect(page.get_by_test_id("model-picker")).to_contain_text("model-f32:latest")
    send(page, "Hello with a key")
    expect(page.get_by_test_id("msg-assistant").last.get_by_test_id("reply-stats")).to_contain_text("tok/s", timeout=30_000)
    assert "?" not in "".join(url for url, _ in api_calls if KEY in url)  # never in a URL
    after = api_calls[[auth for _, auth in api_calls].index(f"Bearer {KEY}"):]
    assert after and all(auth == f"Bearer {KEY}" for _, auth in after)
    context.close()
    assert errors.unexpected(UNAUTHORIZED) == []


def conversations(n: int) -> list[dict]:
    text = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 4
    return [{"id": f"c{i}", "title": f"Conversation {i}", "model": "model-f32:latest", "system": "",
             "updated": 1_700_000_000_000 + i,
             "messages": [{"role": r, "content": f"{r} {i}.{j} {text}"} for j in range(3) for r in ("user", "assistant")]}
            for i in range(n)]


def test_500_conversations_stay_responsive(browser, server, capsys):  # noqa: F811
    started = time.monotonic()
    context, page, errors = open_page(browser, server + "/ui/#/chat",
                                      {"mlxr.apiKey": KEY, "mlxr.conversations": conversations(500)})
    items = page.get_by_test_id("conversation-list").locator("li")
    expect(items).to_have_count(500, timeout=15_000)
    loaded = time.monotonic() - started
    t = time.monotonic()
    page.get_by_role("button", name="Conversation 250", exact=True).click()
    expect(page.get_by_test_id("msg-user").first).to_contain_text("user 250.0")
    switched = time.monotonic() - t
    t = time.monotonic()
    page.get_by_test_id("chat-input").press_sequentially("typing stays quick with 500 chats")
    typed = time.monotonic() - t
    with capsys.disabled():
        print(f"\n500 conversations: load {loaded:.2f}s, switch {switched:.2f}s, type 33 chars {typed:.2f}s")
    assert loaded < 10 and switched < 2 and typed < 2
    context.close()
    assert errors.unexpected() == []


def fill_log(server: str, lines: int) -> None:
    """Each load-only request logs at least its request line; the ring keeps the last 2,000."""
    headers = {"Authorization": f"Bearer {KEY}"}
    body = json.dumps({"model": "model-f32", "prompt": "", "logprobs": True})
    with httpx.Client(headers=headers, timeout=30) as client, ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: client.post(server + "/api/generate", content=body,
                                            headers={"Content-Type": "application/json"}), range(lines)))


def test_a_2000_line_log_tail_stays_responsive(browser, server, capsys):  # noqa: F811
    fill_log(server, 2000)
    started = time.monotonic()
    context, page, errors = open_page(browser, server + "/ui/#/logs", {"mlxr.apiKey": KEY})
    count = page.get_by_test_id("log-count")
    # 2,000 from the ring, plus any line logged live once the page is open (a suite run saw 2,001)
    expect(count).to_contain_text(re.compile(r"\b20\d\d / 20\d\d lines"), timeout=15_000)
    loaded = time.monotonic() - started
    t = time.monotonic()
    page.get_by_test_id("log-search").fill("logprobs requested")
    expect(count).not_to_contain_text("2000 / 2000")
    filtered = time.monotonic() - t
    page.get_by_test_id("log-search").fill("")
    page.get_by_test_id("log-box").evaluate("el => { el.scrollTop = 0; }")
    expect(page.get_by_test_id("log-line").first).to_be_visible()
    with capsys.disabled():
        print(f"\n2000-line log tail: shown in {loaded:.2f}s, search filter {filtered:.2f}s")
    assert loaded < 10 and filtered < 2
    context.close()
    assert errors.unexpected() == []
