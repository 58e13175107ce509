"""kill -9 of the engine core under `mlxr serve --api-servers 2`, once more than the supervisor
restarts it: requests that came in while the dead core was to be replaced wait in their API
process for a core to attach to, and none comes, since the supervisor stops the server. They must
get an answer within seconds, not wait out the graceful shutdown (60 s here), and the server must
exit with status 1 leaving no process behind. The supervisor is paused (SIGSTOP) across the last
kill so that the requests are surely waiting when it decides to stop."""
from __future__ import annotations

import pytest

import concurrent.futures
import os
import signal
import time

import httpx
import psutil

from model_fixtures import fixture_model
from server_harness import server_process

CORE = "mlxr.engine.core.core_proc"
MAX_CORE_RESTARTS = 3  # mlxr/server/supervisor.py: the 4th death within its window stops the server
ANSWER_WITHIN_S = 15.0
CLIENT_TIMEOUT_S = 20.0


def cores(pid: int) -> list[int]:
    return sorted(p.pid for p in psutil.Process(pid).children(recursive=True) if CORE in " ".join(p.cmdline()))


def kill_core_and_wait_for_the_next(url: str, pid: int) -> None:
    (core,) = cores(pid)
    os.kill(core, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = cores(pid)
        if now and now != [core] and httpx.get(url + "/health", timeout=5).status_code == 200:
            return
    raise AssertionError("the engine core was not restarted")


def timed_request(url: str, model: str) -> float:
    t0 = time.monotonic()
    try:
        httpx.post(url + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 4},
                   timeout=CLIENT_TIMEOUT_S)
    except httpx.TimeoutException:
        return float("inf")
    except httpx.TransportError:
        pass  # a connection refused or dropped is an answer too
    return time.monotonic() - t0


@pytest.mark.slow  # ~16 s of restarts: the default suite keeps under 15 minutes
def test_requests_waiting_for_a_core_fail_fast_when_the_supervisor_gives_up(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXR_ENGINE_PROCESS", "1")
    gguf = str(fixture_model("tiny-llama").gguf_path)
    with server_process(tmp_path, "--model", gguf, "--api-servers", "2", "--shutdown-timeout", "60") as (url, proc):
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        for _ in range(MAX_CORE_RESTARTS):
            kill_core_and_wait_for_the_next(url, proc.pid)
        tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            os.kill(cores(proc.pid)[0], signal.SIGKILL)
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                waits = [pool.submit(timed_request, url, model) for _ in range(4)]
                time.sleep(1.5)  # the requests are now waiting for a core to attach to
                os.kill(proc.pid, signal.SIGCONT)
                seconds = [w.result() for w in waits]
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert max(seconds) < ANSWER_WITHIN_S, f"requests answered after {seconds} s"
        assert proc.wait(30) == 1
    time.sleep(1.0)
    left = [pid for pid in tree if running(pid)]
    assert not left, f"processes left behind: {left}"


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
