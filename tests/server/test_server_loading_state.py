"""GET /admin/loading: the loads under way, against a real `mlxr serve` with one model slot.

With --max-loaded-models 1 and the loaded model busy streaming, a request for a second model
waits for the slot: the route lists it (stage, seconds so far) until the first stream ends, then
the second model loads and the list empties; its load time is kept for the next load's estimate."""
from __future__ import annotations

import shutil
import threading
import time

import httpx
import pytest
from model_fixtures import fixture_model
from server_harness import running_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("loading-models")
    alpha, beta = d / "alpha.gguf", d / "beta.gguf"
    shutil.copyfile(fixture_model("tiny-llama-long").gguf_path, alpha)  # a long context: a long stream
    shutil.copyfile(fixture_model("tiny-llama-tied").gguf_path, beta)
    with running_server(d / "home", "--model", str(alpha), "--max-loaded-models", "1") as url:
        r = httpx.post(url + "/api/create", json={"model": "beta", "from": str(beta)}, timeout=60)
        assert r.status_code == 200, r.text
        yield url


def loading(url: str) -> list[dict]:
    r = httpx.get(url + "/admin/loading", timeout=10)
    assert r.status_code == 200
    return r.json()["models"]


def wait_until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def busy_alpha(url: str, stop: threading.Event) -> None:
    """Streams a long reply from alpha until told to stop, then leaves (the server aborts it)."""
    ctx = httpx.post(url + "/api/show", json={"model": "alpha"}, timeout=30).json()["model_info"]["llama.context_length"]
    body = {"model": "alpha", "prompt": "go on", "max_tokens": ctx - 16, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for _ in r.iter_lines():
            if stop.is_set():
                return


def beta_reply(url: str, out: list) -> None:
    r = httpx.post(url + "/api/generate", timeout=120,
                   json={"model": "beta", "prompt": "hi", "stream": False, "options": {"num_predict": 2}})
    out.append(r)


def test_a_model_waiting_for_the_slot_is_listed_until_it_has_loaded(server):
    assert loading(server) == []
    stop, replies = threading.Event(), []
    alpha = threading.Thread(target=busy_alpha, args=(server, stop))
    alpha.start()
    wait_until(lambda: [m for m in httpx.get(server + "/api/ps").json()["models"] if m["name"] == "alpha:latest"],
               30, "alpha to be loaded")
    time.sleep(0.5)  # alpha's stream is under way
    beta = threading.Thread(target=beta_reply, args=(server, replies))
    beta.start()
    first = wait_until(lambda: loading(server), 30, "beta in /admin/loading")
    assert [m["name"] for m in first] == ["beta:latest"]
    assert first[0]["stage"] == "waiting for a slot"
    assert first[0]["previous_load_s"] is None  # never loaded before
    time.sleep(1.0)
    later = loading(server)[0]
    assert later["elapsed_s"] >= first[0]["elapsed_s"] + 0.9
    assert later["started_at"] == first[0]["started_at"]
    assert later["stage"] == "waiting for a slot" and later["stage_elapsed_s"] <= later["elapsed_s"]
    stop.set()
    alpha.join(60)
    beta.join(120)
    assert replies and replies[0].status_code == 200, replies and replies[0].text
    assert loading(server) == []
    # The next load of beta carries the previous one's duration, for the UI's progress estimate.
    httpx.post(server + "/api/generate", json={"model": "beta", "keep_alive": 0}, timeout=60)
    stop.clear()
    alpha = threading.Thread(target=busy_alpha, args=(server, stop))
    alpha.start()
    time.sleep(1.0)
    beta = threading.Thread(target=beta_reply, args=(server, replies))
    beta.start()
    again = wait_until(lambda: loading(server), 30, "beta in /admin/loading again")
    assert again[0]["previous_load_s"] > 0
    stop.set()
    alpha.join(60)
    beta.join(120)
    assert replies[1].status_code == 200
