"""Many concurrent streams, and clients that leave: against a real `mlxr serve` subprocess.

The server gets a small per-step token budget so a long prompt takes many steps to prefill,
which leaves time to disconnect while requests are queued or prefilling: the model has a long
context, so those steps outlast the test's round trips on however fast a host."""
from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import time
from urllib.parse import urlparse

import httpx
import openai
import pytest
from model_fixtures import fixture_model
from server_harness import server_log, server_process, tiny_llama_server

NUM_STREAMS = 32


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def base_url(home):
    args = ("--max-num-batched-tokens", "4", "--max-num-seqs", "64", "--log-stats-every", "0.5")
    with tiny_llama_server(home, *args, fixture="tiny-llama-long") as url:
        yield url


@pytest.fixture(scope="module")
def model(base_url) -> str:
    return httpx.get(base_url + "/v1/models").json()["data"][0]["id"]


def prompts() -> list[str]:
    words = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree"]
    return [" ".join(words[(i + j) % 8] for j in range(2 + i % 6)) + f" {i}" for i in range(NUM_STREAMS)]


async def _stream_one(client: openai.AsyncOpenAI, model: str, prompt: str) -> str:
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0, stream=True)
    return "".join([c.choices[0].text async for c in stream if c.choices])


def test_concurrent_streams_match_sequential(base_url, model, home):
    async def run() -> tuple[list[str], list[str]]:
        client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120)
        together = await asyncio.gather(*[_stream_one(client, model, p) for p in prompts()])
        alone = [await _stream_one(client, model, p) for p in prompts()]
        await client.close()
        return together, alone

    together, alone = asyncio.run(run())
    assert len(together) == NUM_STREAMS and all(together)
    assert together == alone
    assert_idle(base_url)
    assert_logged(home)


def assert_logged(home) -> None:
    lines = [json.loads(x) for x in server_log(home).splitlines() if x.startswith("{")]
    requests = [x for x in lines if x["msg"] == "request" and x["route"] == "/v1/completions"]
    assert len(requests) >= 2 * NUM_STREAMS
    assert all(r["status"] == 200 and r["completion_tokens"] == 12 and r["ttft_s"] > 0 for r in requests)
    busy = [x for x in lines if x["msg"] == "throughput"]
    assert busy, "no throughput line while busy"
    for key in ("prompt_tok_s", "generation_tok_s", "running", "waiting", "kv_usage", "prefix_cache_hit_rate"):
        assert key in busy[0]


def stats(base_url: str) -> dict:
    return next(iter(httpx.get(base_url + "/admin/stats").json()["models"].values()))


def metric(base_url: str, name: str) -> float:
    text = httpx.get(base_url + "/metrics").text
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def assert_idle(base_url: str, timeout_s: float = 15.0) -> dict:
    """Running, waiting, KV blocks in use and HTTP requests in flight all back to zero."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = stats(base_url)
        busy = s["num_requests_running"] + s["num_requests_waiting"] + s["kv_blocks_used"] + s["active_http_requests"]
        if busy == 0:
            break
        assert time.monotonic() < deadline, f"still busy: {s}"
        time.sleep(0.1)
    assert metric(base_url, "vllm:num_requests_running") == 0
    assert metric(base_url, "vllm:num_requests_waiting") == 0
    assert metric(base_url, "vllm:kv_cache_usage_perc") == 0
    return s


def raw_post(base_url: str, path: str, body: dict) -> socket.socket:
    """Send a request on a bare socket, so the test decides exactly when the connection goes."""
    u = urlparse(base_url)
    data = json.dumps(body).encode()
    sock = socket.create_connection((u.hostname, u.port))
    head = (f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode()
    sock.sendall(head + data)
    return sock


LONG_PROMPT = 2000


def long_prompt(i: int, salt: int) -> list[int]:
    # Distinct from the first block on, so the prefix cache cannot shortcut the prefill.
    return [1] + [(7 * i + 131 * salt + 3 * j) % 500 + 3 for j in range(LONG_PROMPT - 1)]


def wait_for(pred, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_while_queued_or_prefilling(base_url, model, stream):
    before, gen0 = stats(base_url)["num_aborted"], stats(base_url)["generation_tokens_total"]
    n = 12
    socks = [raw_post(base_url, "/v1/completions", {
        "model": model, "prompt": long_prompt(i, int(stream)), "max_tokens": 20, "stream": stream})
        for i in range(n)]
    # 12 x 2,000 prompt tokens at 4 tokens a step: 500 steps of prefill before the first can
    # decode, 667 more before the second can.
    wait_for(lambda: stats(base_url)["active_http_requests"] == n)
    s = stats(base_url)
    assert s["num_requests_waiting"] > 0 and s["kv_blocks_used"] > 0
    for sock in socks:
        sock.close()
    after = assert_idle(base_url)
    # The others wait behind the first one's prefill at 4 tokens a step, so at most the first
    # can have decoded (on a very fast host) before the sockets closed; every other one was
    # aborted while queued or prefilling.
    assert after["num_aborted"] - before >= n - 1
    assert after["generation_tokens_total"] - gen0 <= 20


def test_disconnect_mid_stream(base_url, model):
    before = stats(base_url)["num_aborted"]
    with httpx.Client(timeout=60) as client:
        body = {"model": model, "prompt": "tell me", "max_tokens": 3000, "stream": True, "ignore_eos": True}
        with client.stream("POST", base_url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(line.startswith("data: ") for line in got)
            assert stats(base_url)["num_requests_running"] == 1
        # leaving the block closes the connection with the body unread
    after = assert_idle(base_url)
    assert after["num_aborted"] == before + 1
    assert metric(base_url, "mlxr:num_requests_aborted_total") == after["num_aborted"]


def test_sigterm_drains_in_flight_streams(tmp_path):
    # The long-context fixture: a stream of 1,500 tokens is still in flight when SIGTERM lands.
    gguf = fixture_model("tiny-llama-long").gguf_path
    with server_process(tmp_path / "home", "--model", str(gguf)) as (url, proc):
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": "go", "max_tokens": 1500, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        last = json.loads(rest[-2][len("data: "):])
        assert last["choices"][0]["finish_reason"] == "length"
        # uvicorn re-raises the signal once it has shut down cleanly.
        assert proc.wait(30) in (0, -signal.SIGTERM)
        # New connections are refused once shutdown began.
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=2)
    log = server_log(tmp_path / "home")
    assert "Application shutdown complete" in log and "unloaded model" in log
