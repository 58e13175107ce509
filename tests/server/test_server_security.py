"""API keys, Host-header tricks, CORS, bind refusal and load shedding, against a real server."""
from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from urllib.parse import urlparse

import httpx
import pytest
from server_harness import (
    ROOT,
    free_port,
    server_command,
    tiny_llama_server,
)

KEY = "test-secret-key"
GUARDED = [
    ("GET", "/v1/models"), ("GET", "/v1/models/x:latest"), ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"), ("POST", "/v1/embeddings"), ("GET", "/metrics"),
    ("GET", "/admin/stats"), ("GET", "/api/tags"), ("GET", "/api/ps"), ("POST", "/api/generate"),
    ("POST", "/api/chat"), ("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/redoc"),
    ("GET", "/"), ("GET", "/no/such/route"), ("POST", "/tokenize"), ("POST", "/detokenize"),
    ("GET", "/tokenizer_info"),
]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    # A tiny queue and step budget so the queue limit can be reached on purpose.
    args = ("--max-waiting", "2", "--max-num-batched-tokens", "8")
    # The long-context fixture: a prompt of 2,000 tokens takes 250 steps, so a burst's requests
    # meet a full queue however fast the host prefills.
    with tiny_llama_server(tmp_path_factory.mktemp("home"), *args, api_key=KEY, fixture="tiny-llama-long") as url:
        yield url


def auth(key: str = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("method,path", GUARDED)
def test_every_route_needs_the_key(base_url, method, path):
    for headers in ({}, auth("wrong"), {"Authorization": KEY}, {"Authorization": "Basic " + KEY}):
        r = httpx.request(method, base_url + path, headers=headers, json={})
        assert r.status_code == 401, (path, headers, r.text)
        assert "error" in r.json()


def test_health_is_open_and_key_works(base_url):
    assert httpx.get(base_url + "/health").status_code == 200
    assert httpx.get(base_url + "/v1/models", headers=auth()).status_code == 200
    assert httpx.get(base_url + "/metrics", headers=auth()).status_code == 200
    assert httpx.get(base_url + "/openapi.json", headers=auth()).status_code == 200
    assert httpx.post(base_url + "/tokenize", headers=auth(), json={"prompt": "hi"}).json()["count"] > 0


def raw(base_url: str, request: bytes) -> bytes:
    u = urlparse(base_url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(request)
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


@pytest.mark.parametrize("host", ["localhost/health", "127.0.0.1/health?", "evil.example", "localhost:1/health#"])
def test_host_header_gains_nothing(base_url, host):
    r = httpx.get(base_url + "/v1/models", headers={"Host": host})
    assert r.status_code in (401, 403) and b'"data"' not in r.content


@pytest.mark.parametrize("target", [
    "http://127.0.0.1/v1/models", "http://localhost/health/../v1/models", "/health/../v1/models",
    "//v1/models", "/health/%2e%2e/v1/models", "/v1/models?/health", "/health/",
])
def test_request_target_tricks_gain_nothing(base_url, target):
    resp = raw(base_url, f"GET {target} HTTP/1.1\r\nHost: localhost/health\r\nConnection: close\r\n\r\n".encode())
    status = int(resp.split(b" ", 2)[1])
    assert status in (400, 401, 403, 404), resp[:300]
    assert b'"data"' not in resp  # never the model list


def test_cors_only_localhost_by_default(base_url):
    pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    ok = httpx.options(base_url + "/v1/models", headers={"Origin": "http://localhost:3000", **pre})
    assert ok.headers.get("access-control-allow-origin") == "http://localhost:3000"
    bad = httpx.options(base_url + "/v1/models", headers={"Origin": "http://evil.example", **pre})
    assert "access-control-allow-origin" not in bad.headers
    # A preflight never reaches a route: nothing is served without the key.
    assert b'"data"' not in bad.content and b'"data"' not in ok.content


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "example.com"])
def test_non_loopback_without_key_is_refused(tmp_path, host):
    cmd = server_command(tmp_path / "home", free_port())
    cmd[cmd.index("--port"):cmd.index("--port")] = ["--host", host]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode != 0
    assert "API key" in done.stderr and host in done.stderr
    assert time.monotonic() - t0 < 30  # refused before loading anything


def test_api_key_file(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("")
    cmd = server_command(tmp_path / "home", free_port(), "--api-key-file", str(key_file))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode != 0 and "empty" in done.stderr


@pytest.mark.parametrize("key", [" ", "\t\n"])
def test_blank_api_key_is_refused(tmp_path, key):
    """A blank key passed the public-bind check, then matched no request (issue #16)."""
    cmd = server_command(tmp_path / "home", free_port(), "--host", "0.0.0.0", api_key=key)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode != 0 and "blank" in done.stderr


def test_queue_full_is_503_with_retry_after(base_url):
    model = httpx.get(base_url + "/v1/models", headers=auth()).json()["data"][0]["id"]
    # Batches of --max-waiting long prompts (each fits the queue alone), sent together: the
    # queue fills and some are refused. Repeated: a refused batch's admitted siblings are
    # aborted mid-admission each time, which once killed the engine thread.
    body = {"model": model, "prompt": [[1] + [5 + j % 400 for j in range(1999)] for _ in range(2)], "max_tokens": 2}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base_url, headers=auth(), timeout=60) as http:
            return await asyncio.gather(*[http.post("/v1/completions", json=body) for _ in range(4)])

    for _ in range(5):
        replies = asyncio.run(burst())
        refused = [r for r in replies if r.status_code == 503]
        assert refused and all(r.status_code in (200, 503) for r in replies), [r.text for r in replies]
        assert all(r.headers["retry-after"] and "waiting" in r.json()["error"]["message"] for r in refused)
    assert httpx.get(base_url + "/health").json()["status"] == "ok"
    ok = httpx.post(base_url + "/v1/completions", headers=auth(), timeout=60,
                    json={"model": model, "prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200


def test_batch_larger_than_the_queue_is_400_not_a_503_forever(base_url):
    model = httpx.get(base_url + "/v1/models", headers=auth()).json()["data"][0]["id"]
    r = httpx.post(base_url + "/v1/completions", headers=auth(), timeout=60,
                   json={"model": model, "prompt": ["a"] * 6, "max_tokens": 2})
    assert r.status_code == 400 and "--max-waiting" in r.json()["error"]["message"], r.text


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
