"""DNS rebinding and cross-site requests (issue #16 D1) against a real server without an API
key: a foreign Host or Origin is a 403 on every route, and only JSON bodies are read, so a
browser page elsewhere can neither read nor change anything."""
from __future__ import annotations

import socket
from urllib.parse import urlparse

import httpx
import ollama
import pytest
from server_harness import tiny_llama_server

from mlxr.server.access import AccessPolicy, host_name

CONFIGURED_HOST = "mlxr.box.test"
CONFIGURED_ORIGIN = "https://app.example"
ROUTES = [("GET", "/health"), ("GET", "/api/tags"), ("GET", "/api/ps"), ("GET", "/v1/models"),
          ("GET", "/metrics"), ("GET", "/openapi.json"), ("POST", "/api/copy"), ("POST", "/api/create"),
          ("POST", "/api/pull"), ("POST", "/api/generate"), ("POST", "/v1/chat/completions"),
          ("DELETE", "/api/delete"), ("GET", "/no/such/route")]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    args = ("--allowed-host", CONFIGURED_HOST, "--cors-origin", CONFIGURED_ORIGIN)
    with tiny_llama_server(tmp_path_factory.mktemp("home"), *args) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url) -> ollama.Client:
    return ollama.Client(host=base_url, timeout=60)


@pytest.fixture(scope="module")
def name(client) -> str:
    return client.list().models[0].model


def port(base_url: str) -> int:
    return urlparse(base_url).port


def tags(client) -> list[str]:
    return [m.model for m in client.list().models]


@pytest.mark.parametrize("method,path", ROUTES)
def test_foreign_host_is_403_everywhere(base_url, method, path):
    for host in ("evil.example", f"evil.example:{port(base_url)}", "localhost.evil.example",
                 "127.0.0.1.nip.io", "localhost/health", "localhost:1@evil.example", "8.8.8.8"):
        r = httpx.request(method, base_url + path, headers={"Host": host}, json={"model": "x"})
        assert r.status_code == 403, (host, r.text)
        assert "Host" in r.text


@pytest.mark.parametrize("method,path", ROUTES)
def test_foreign_origin_is_403_everywhere(base_url, method, path):
    for origin in ("http://evil.example", "null", f"http://evil.example:{port(base_url)}",
                   "file://", "http://localhost.evil.example"):
        r = httpx.request(method, base_url + path, headers={"Origin": origin}, json={"model": "x"})
        assert r.status_code == 403, (origin, r.text)


def test_loopback_and_configured_hosts_pass(base_url):
    p = port(base_url)
    # IP literals of local networks cannot come from a rebinding page (it needs a DNS name),
    # and `mlxr ps` with MLXR_HOST=0.0.0.0 sends one.
    for host in (f"localhost:{p}", "localhost", f"127.0.0.1:{p}", f"[::1]:{p}", "127.0.0.5", f"0.0.0.0:{p}",
                 "192.168.1.7", f"[fe80::1]:{p}", "app.localhost", socket.gethostname(),
                 CONFIGURED_HOST, f"{CONFIGURED_HOST.upper()}:{p}"):
        assert httpx.get(base_url + "/api/tags", headers={"Host": host}).status_code == 200, host


def test_allowed_origins_pass(base_url, name):
    p = port(base_url)
    body = {"model": name, "prompt": "hi", "stream": False, "options": {"num_predict": 1}}
    for origin in ("http://localhost:3000", f"http://127.0.0.1:{p}", f"http://[::1]:{p}", CONFIGURED_ORIGIN,
                   f"http://{CONFIGURED_HOST}:{p}"):
        host = f"{CONFIGURED_HOST}:{p}" if CONFIGURED_HOST in origin else f"127.0.0.1:{p}"
        r = httpx.post(base_url + "/api/generate", json=body, headers={"Origin": origin, "Host": host}, timeout=60)
        assert r.status_code == 200, (origin, r.text)
    # CORS lets the configured origin read the answer, not only send the request.
    r = httpx.get(base_url + "/api/tags", headers={"Origin": CONFIGURED_ORIGIN})
    assert r.headers["access-control-allow-origin"] == CONFIGURED_ORIGIN


def test_cross_site_simple_post_has_no_side_effect(base_url, client, name):
    """The reproduction: text/plain and form bodies from another site ran /api/copy."""
    body = '{"source": "%s", "destination": "stolen:x"}' % name
    for headers in ({"Origin": "http://evil.example", "Content-Type": "text/plain"},
                    {"Origin": "http://evil.example", "Content-Type": "application/x-www-form-urlencoded"},
                    {"Origin": "http://localhost:3000", "Content-Type": "text/plain"},
                    {"Origin": "http://localhost:3000", "Content-Type": "application/x-www-form-urlencoded"},
                    {"Content-Type": "text/plain"}, {"Content-Type": "multipart/form-data; boundary=x"}):
        r = httpx.post(base_url + "/api/copy", content=body, headers=headers)
        assert r.status_code in (403, 415), (headers, r.text)
        assert "stolen:x" not in tags(client)
    r = httpx.post(base_url + "/v1/completions", content='{"model": "%s", "prompt": "x"}' % name,
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]


def test_json_and_curl_bodies_still_work(base_url, client, name):
    assert client.copy(name, "copied:ok").status == "success"
    assert "copied:ok:latest" in tags(client) or "copied:ok" in tags(client)
    client.delete("copied:ok")
    # `curl -d` (a form type, no Origin: not a browser) stays Ollama-compatible on /api.
    r = httpx.post(base_url + "/api/copy", content='{"source": "%s", "destination": "curl:x"}' % name,
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200, r.text
    client.delete("curl:x")


def test_policy_of_a_public_bind():
    """Bound to 0.0.0.0 (which needs an API key) clients use names we cannot know, as with
    Ollama; naming hosts turns the check back on."""
    public = AccessPolicy.build("0.0.0.0", (), ())
    assert public.host_allowed("192.168.1.7:11434") and public.host_allowed("box.lan")
    assert not public.origin_allowed("http://evil.example", "box.lan:11434")
    assert public.origin_allowed("http://box.lan:11434", "box.lan:11434")  # the web UI, same origin
    named = AccessPolicy.build("0.0.0.0", ("box.lan",), ())
    assert named.host_allowed("box.lan:11434") and not named.host_allowed("evil.example")
    assert host_name("[::1]:80") == "[::1]" and host_name("a b") is None
