"""The web UI's serving side against a real `mlxr serve`: / for browsers and API clients,
/ui/ with its CSP, offline /docs, the read-only config and the SSE log tail."""
from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest
from model_fixtures import fixture_model
from server_harness import server_process, tiny_llama_server

KEY = "webui-serving-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with tiny_llama_server(tmp_path_factory.mktemp("webui-serving"), api_key=KEY) as url:
        yield url


def authed() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def test_root_redirects_browsers_and_keeps_ollama_text_for_api_clients(server):
    browser = httpx.get(server + "/", headers={"Accept": "text/html,application/xhtml+xml"}, follow_redirects=False)
    assert browser.status_code == 307 and browser.headers["location"] == "/ui/"
    api = httpx.get(server + "/", headers=authed())
    assert api.status_code == 200 and api.text == "Ollama is running"
    assert httpx.head(server + "/").status_code == 200


def test_ui_is_served_without_a_key_with_a_strict_csp(server):
    page = httpx.get(server + "/ui/")
    assert page.status_code == 200 and '<div id="root">' in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
    script = page.text.split('src="')[1].split('"')[0]
    assert script.startswith("/ui/assets/") and httpx.get(server + script).status_code == 200
    for escape in ("/ui/..%2f..%2f__init__.py", "/ui/../webui/__init__.py", "/ui/%2e%2e/__init__.py",
                   "/ui/no-such-file.js", "/docs-assets/no-such-file.js"):
        assert httpx.get(server + escape).status_code in (401, 404), escape
    assert httpx.post(server + "/ui/").status_code == 405
    # The page loads without a key; the API behind it does not.
    assert httpx.get(server + "/api/tags").status_code == 401


def test_docs_load_their_assets_from_this_server(server):
    docs = httpx.get(server + "/docs", headers=authed())
    assert docs.status_code == 200
    assert "cdn" not in docs.text.lower() and "/docs-assets/swagger-ui-bundle.js" in docs.text
    bundle = httpx.get(server + "/docs-assets/swagger-ui-bundle.js")
    assert bundle.status_code == 200 and len(bundle.content) > 100_000
    redoc = httpx.get(server + "/redoc", headers=authed())
    assert redoc.status_code == 200 and "/docs-assets/redoc-offline.js" in redoc.text
    assert "googleapis" not in redoc.text and "cdn" not in redoc.text.lower()
    bundle = httpx.get(server + "/docs-assets/redoc-offline.js")  # ReDoc's footer logo is local
    assert bundle.status_code == 200 and len(bundle.content) > 100_000 and b"cdn.redoc.ly" not in bundle.content


def test_config_is_read_only_and_hides_the_key(server):
    config = httpx.get(server + "/admin/config", headers=authed()).json()
    assert config["api_key_required"] is True and "api_keys" not in config
    assert KEY not in json.dumps(config)


def test_log_stream_sends_backlog_then_live_lines(server):
    with httpx.stream("GET", server + "/admin/logs/stream?backlog=50", headers=authed(), timeout=30) as res:
        assert res.status_code == 200 and res.headers["content-type"].startswith("text/event-stream")
        lines = res.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        assert {"ts", "level", "logger", "msg"} <= set(first)
        httpx.post(server + "/api/embed", headers=authed(), json={"model": "model-f32", "input": "hello"})
        for line in lines:
            if line.startswith("data: ") and json.loads(line[6:]).get("route") == "/api/embed":
                break
    assert httpx.get(server + "/admin/logs/stream", headers={}).status_code == 401


def test_tokenize_gives_each_token_with_its_text(server):
    text = "Hello tokenizer world!"
    res = httpx.post(server + "/admin/tokenize", headers=authed(), json={"model": "model-f32", "text": text})
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["count"] == len(body["tokens"]) > 1
    assert body["tokens"][0]["special"] is True  # the model's BOS
    assert "".join(t["text"] for t in body["tokens"] if not t["special"]) == text
    bad = httpx.post(server + "/admin/tokenize", headers=authed(), json={"model": "model-f32", "text": "x" * 100_001})
    assert bad.status_code == 400
    missing = httpx.post(server + "/admin/tokenize", headers=authed(), json={"model": "nope", "text": "x"})
    assert missing.status_code == 404


def test_log_tail_keeps_a_bounded_ring_and_drops_lines_for_a_stalled_reader():
    import asyncio
    import logging

    from mlxr.server.log_tail import SUBSCRIBER_QUEUE, LogTail

    async def run() -> tuple[int, int, str]:
        tail = LogTail(ring_lines=50)
        log = logging.getLogger("mlxr.test.tail")
        log.addHandler(tail)
        log.setLevel(logging.INFO)
        queue = tail.subscribe()
        try:
            for i in range(SUBSCRIBER_QUEUE + 200):
                log.info("line %d", i)
            await asyncio.sleep(0.05)  # lines reach readers through the event loop
        finally:
            log.removeHandler(tail)
            tail.unsubscribe(queue)
        return len(tail.ring), queue.qsize(), json.loads(tail.ring[-1])["msg"]

    ring, queued, last = asyncio.run(run())
    assert ring == 50 and last == f"line {SUBSCRIBER_QUEUE + 199}"
    assert queued == SUBSCRIBER_QUEUE


def test_an_open_log_stream_does_not_hold_up_shutdown(tmp_path):
    gguf = str(fixture_model("tiny-llama").gguf_path)
    with server_process(tmp_path / "home", "--model", gguf) as (url, proc):
        opened = threading.Event()

        def read() -> None:
            try:
                with httpx.stream("GET", url + "/admin/logs/stream", timeout=None) as res:
                    opened.set()
                    for _ in res.iter_lines():
                        pass
            except httpx.HTTPError:
                pass

        threading.Thread(target=read, daemon=True).start()
        assert opened.wait(10)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)  # the shutdown timeout is 60 s: a stream holding it would time out here
        assert time.monotonic() - started < 10 and proc.returncode in (0, -signal.SIGTERM)
