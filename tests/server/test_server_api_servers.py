"""`mlxr serve --api-servers 2`: two API processes in front of one engine core, as real
processes driven by the official openai client. Both processes serve (each one's own counters
in /admin/stats), greedy outputs equal the one-process server's, only the models given at start
are served, a killed core fails every stream within seconds and is restarted, a dead API
process stops the server, and no process outlives the supervisor."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from model_fixtures import fixture_model
from server_harness import ROOT, free_port, server_command, server_process, stop_server

MODEL = "model-f32"  # the tiny-llama fixture's GGUF, as the registry names it
GGUF = lambda: str(fixture_model("tiny-llama").gguf_path)  # noqa: E731


@pytest.fixture(autouse=True)
def _core_in_its_own_process(monkeypatch):
    monkeypatch.setenv("MLXR_ENGINE_PROCESS", "1")  # the test session defaults to 0 (conftest)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _stream(client: openai.OpenAI, prompt: str, max_tokens: int = 16) -> tuple[str, str | None]:
    text, reason = "", None
    for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                           stream=True):
        text += chunk.choices[0].text
        reason = chunk.choices[0].finish_reason or reason
    return text, reason


def _streams(url: str, prompts: list[str]) -> list[tuple[str, str | None]]:
    client = _client(url)
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: _stream(client, p), prompts))


def _per_process_stats(url: str, count: int) -> dict[int, dict]:
    """/admin/stats of each API process: each new connection lands on one of them (SO_REUSEPORT
    hashes the client's port), so a few dozen reach all of them."""
    seen: dict[int, dict] = {}
    for _ in range(64):
        body = httpx.get(url + "/admin/stats", timeout=10).json()  # a new connection each time
        seen[body["api_server"]["index"]] = body
        if len(seen) == count:
            return seen
    raise AssertionError(f"reached only API processes {sorted(seen)}")


def _finished(stats: dict) -> int:
    return sum(stats["models"][f"{MODEL}:latest"]["finished_by_reason"].values())


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [d for p in out for d in (int(p), *_descendants(int(p)))]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _all_gone(pids: list[int], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.slow  # ~13 s: the default suite keeps under 15 minutes
def test_two_api_processes_both_serve_and_give_the_one_process_outputs(tmp_path):
    prompts = [f"Story number {i} begins" for i in range(24)]
    with server_process(tmp_path / "one", "--model", GGUF()) as (url, _):
        want = _streams(url, prompts)
    with server_process(tmp_path / "two", "--model", GGUF(), "--api-servers", "2") as (url, server):
        before = {i: _finished(s) for i, s in _per_process_stats(url, 2).items()}
        assert _streams(url, prompts) == want
        after = _per_process_stats(url, 2)
        served = {i: _finished(s) - before[i] for i, s in after.items()}
        assert sum(served.values()) == len(prompts) and min(served.values()) > 0, served
        pids = {s["api_server"]["pid"] for s in after.values()}
        workers = [p for p in _descendants(server.pid) if "mlxr.server.api_worker" in _cmdline(p)]
        assert pids == set(workers) and server.pid not in pids


@pytest.mark.gpu
def test_on_cuda_two_api_processes_give_the_one_process_outputs(tmp_path):
    prompts = [f"Story number {i} begins" for i in range(32)]
    flags = ("--model", GGUF(), "--device", "cuda", "--dtype", "bfloat16")
    with server_process(tmp_path / "one", *flags) as (url, _):
        want = _streams(url, prompts)
    with server_process(tmp_path / "two", *flags, "--api-servers", "2") as (url, _):
        assert _streams(url, prompts) == want
        assert len(_per_process_stats(url, 2)) == 2


def test_only_the_models_given_at_start_are_served_and_ctrl_c_stops_everything(tmp_path):
    from mlxr.registry import Registry

    Registry(tmp_path / "home").import_model(fixture_model("tiny-llama-tied").gguf_path, name="other")
    with server_process(tmp_path / "home", "--model", GGUF(), "--api-servers", "2") as (url, server):
        with pytest.raises(openai.NotFoundError, match="--api-servers 2"):
            _client(url).completions.create(model="other", prompt="hi", max_tokens=2)
        assert _stream(_client(url), "hi", 2)[1] == "length"
        with pytest.raises(ollama.ResponseError, match="pinned by --api-servers") as refused:
            ollama.Client(host=url).delete(MODEL)
        assert refused.value.status_code == 400
        children = _descendants(server.pid)
        server.send_signal(signal.SIGINT)
        assert server.wait(30) == 0
        assert _all_gone(children, 15)


@pytest.mark.parametrize("args, env, message", [
    (["--api-servers", "0"], {}, "--api-servers"),
    (["--api-servers", "17"], {}, "--api-servers"),
    ([], {"MLXR_API_SERVERS": "x"}, "--api-servers"),
    (["--api-servers", "2"], {"MLXR_ENGINE_PROCESS": "0"}, "MLXR_ENGINE_PROCESS=0"),
])
def test_bad_settings_are_refused_before_anything_starts(tmp_path, monkeypatch, args, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cmd = server_command(tmp_path / "home", free_port(), "--model", GGUF(), *args)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT, env=dict(os.environ))
    assert done.returncode != 0 and message in done.stderr, done.stderr[-2000:]


def test_a_killed_core_fails_every_stream_within_seconds_and_comes_back(tmp_path):
    # Two sequences at a time: the tiny model's 16 x 200 tokens last seconds, not a fraction of one.
    flags = ("--model", GGUF(), "--api-servers", "2", "--max-num-seqs", "2")
    with server_process(tmp_path / "home", *flags) as (url, server):
        children = _descendants(server.pid)
        core = [p for p in children if "mlxr.engine.core.core_proc" in _cmdline(p)]
        assert len(core) == 1
        client, started, ended = _client(url), [], {}

        def stream(i: int) -> str:
            tokens, reason = 0, None
            try:
                for chunk in client.completions.create(model=MODEL, prompt=f"s{i}", max_tokens=200, temperature=0,
                                                       stream=True, extra_body={"ignore_eos": True}):
                    started.append(i) if i not in started else None
                    tokens += 1
                    reason = chunk.choices[0].finish_reason or reason
                return "complete" if reason == "length" else f"cut after {tokens} chunks"
            except openai.APIError as e:
                return f"error: {e}"
            finally:
                ended[i] = time.monotonic()

        with ThreadPoolExecutor(17) as pool:  # 16 streams and the /health poll
            results = [pool.submit(stream, i) for i in range(16)]
            deadline = time.monotonic() + 60
            while not started and time.monotonic() < deadline:
                time.sleep(0.005)
            killed_at = time.monotonic()
            os.kill(core[0], signal.SIGKILL)
            health = pool.submit(_health_until, url, 503, 20.0)  # polled from the kill on: a restart is quick
            outcomes = [r.result(30) for r in results]
            assert health.result(30), "/health never reported the dead core"
        # On a loaded host the kill may land late, after some streams got all their tokens; every
        # stream the kill reached must end in an error: the core's, or a retry-later 503 for one
        # that reached an API process while the core was gone. None may end cut without one.
        errors = [o for o in outcomes if o.startswith("error") and ("engine core" in o or "retry the request" in o)]
        assert errors and all(o == "complete" or o in errors for o in outcomes), outcomes
        # A failed stream fails within seconds; one that reached an API process after the kill may
        # wait for the restarted core and complete (the restart is bounded below).
        failed_after = {i: round(ended[i] - killed_at, 2) for i, o in enumerate(outcomes) if o != "complete"}
        assert max(failed_after.values()) < 5.0, (outcomes, failed_after)
        deadline = time.monotonic() + 60  # the supervisor restarts the core; both processes attach again
        while not all(_health(url) == 200 for _ in range(16)):
            assert time.monotonic() < deadline, "/health did not recover"
            time.sleep(0.2)
        assert _stream(client, "again", 4)[1] == "length"
        everyone = _descendants(server.pid)
        assert stop_server(server) == 0
    assert _all_gone(everyone + children, 15), [p for p in everyone + children if _alive(p)]


def _health_until(url: str, status: int, seconds: float) -> bool:
    """True once /health answers `status` (each API process answers for itself) within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if _health(url) == status:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.01)
    return False


def _health(url: str) -> int:
    return httpx.get(url + "/health", timeout=10).status_code


@pytest.mark.slow  # ~13 s: the default suite keeps under 15 minutes
def test_a_dead_api_process_stops_the_server_and_a_killed_supervisor_leaves_nothing(tmp_path):
    with server_process(tmp_path / "a", "--model", GGUF(), "--api-servers", "2") as (url, server):
        children = _descendants(server.pid)
        worker = next(p for p in children if "mlxr.server.api_worker" in _cmdline(p))
        os.kill(worker, signal.SIGKILL)
        assert server.wait(30) == 1
        assert _all_gone(children, 15)
    with server_process(tmp_path / "b", "--model", GGUF(), "--api-servers", "2") as (url, server):
        children = _descendants(server.pid)
        assert len(children) >= 3  # two API processes and the core
        server.kill()
        assert _all_gone(children, 15), [_cmdline(p) for p in children if _alive(p)]
