"""The engine core in its own process: same tokens as in-process, and its faults: a killed core
fails every stream within seconds, /health says so, the server loads the model again on the
next request, and no core outlives its server."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from model_fixtures import fixture_model
from mlxr import LLM, SamplingParams
from mlxr.engine.frontend.async_engine import AsyncEngine
from server_harness import server_process, stop_server

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(fixture_model("tiny-llama").hf_dir)


@pytest.fixture(scope="module")
def both(model_dir):
    inproc = LLM(model_dir, dtype="float32")
    proc = LLM(model_dir, dtype="float32", engine_process=True)
    yield inproc, proc
    proc.shutdown()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _wait_gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_the_core_process_gives_the_in_process_tokens_and_texts(both):
    inproc, proc = both
    assert proc.loaded is None and proc.engine.core.pid != os.getpid()
    prompts = ["Once upon a time", [5, 6, 7, 8], "The capital of"]
    params = [GREEDY, SamplingParams(max_tokens=9, temperature=0.9, seed=5, n=2, logprobs=2),
              SamplingParams(max_tokens=12, temperature=0.0, stop=["e"])]
    want, got = inproc.generate(prompts, params), proc.generate(prompts, params)
    for w, g in zip(want, got):
        assert [(o.token_ids, o.text, o.finish_reason) for o in g.outputs] == \
               [(o.token_ids, o.text, o.finish_reason) for o in w.outputs]
    assert got[1].outputs[0].logprobs[0].keys() == want[1].outputs[0].logprobs[0].keys()
    assert proc.engine.embed("hello world")[0] == pytest.approx(inproc.engine.embed("hello world")[0], abs=1e-6)
    stats = proc.engine.stats()
    assert stats.kv_blocks_used == 0 and stats.max_model_len == inproc.engine.max_model_len > 0


def test_a_killed_core_fails_every_stream_within_seconds():
    # The long-context fixture: no stream of 3,000 tokens can end before the kill.
    llm = LLM(str(fixture_model("tiny-llama-long").hf_dir), dtype="float32", engine_process=True)
    ae = AsyncEngine(llm.engine)
    pid = llm.engine.core.pid

    started = 0

    async def stream(i: int) -> tuple[str, float]:
        nonlocal started
        last = None
        async for out in ae.stream(f"s{i}", [5 + i, 6, 7], SamplingParams(max_tokens=3000, temperature=0.0,
                                                                           ignore_eos=True)):
            started += last is None
            last = out
        return last.error or last.outputs[0].finish_reason, time.monotonic()

    async def main():
        tasks = [asyncio.ensure_future(stream(i)) for i in range(16)]
        while started < 16:  # every stream has its first tokens: kill the core mid-decode
            await asyncio.sleep(0.001)
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return killed_at, results

    try:
        killed_at, results = asyncio.run(main())
        assert all("engine core process" in error for error, _ in results), results
        assert max(t for _, t in results) - killed_at < 5.0
        assert not ae.is_alive
    finally:
        ae.shutdown()


def test_a_server_reports_a_dead_core_loads_again_and_leaves_no_process(tmp_path, monkeypatch):
    gguf = fixture_model("tiny-llama").gguf_path
    monkeypatch.setenv("MLXR_ENGINE_PROCESS", "1")
    with server_process(tmp_path / "home", "--model", str(gguf)) as (url, server):
        # Greedy: a sampled reply of a random model may be 4 tokens that print as nothing.
        body = {"model": "tiny-llama", "prompt": "Once upon", "stream": False,
                "options": {"num_predict": 4, "temperature": 0}}
        name = httpx.get(url + "/api/tags").json()["models"][0]["name"]
        body["model"] = name
        assert httpx.post(url + "/api/generate", json=body, timeout=120).status_code == 200
        core = _children(server.pid)
        assert len(core) == 1
        os.kill(core[0], signal.SIGKILL)
        assert _wait_gone(core[0], 5)
        health = _health_within(url, 503, 5.0)
        assert health.json()["status"] == "degraded"
        again = httpx.post(url + "/api/generate", json=body, timeout=120)  # loads the model again
        assert again.status_code == 200 and again.json()["response"]
        assert _health_within(url, 200, 5.0).json()["status"] == "ok"
        new_core = _children(server.pid)
        assert len(new_core) == 1 and new_core != core
        assert stop_server(server) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean shutdown
    assert _wait_gone(new_core[0], 10), "the engine core outlived its server"


def test_a_core_whose_server_was_killed_exits(model_dir, tmp_path):
    script = (f"import sys, time; from mlxr import LLM; llm = LLM({model_dir!r}, engine_process=True); "
              "print(llm.engine.core.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        pid = int(parent.stdout.readline())
        assert _alive(pid)
        parent.kill()
        parent.wait()
        assert _wait_gone(pid, 10)
    finally:
        parent.kill()


def test_a_frontend_process_tunes_its_collector_too(model_dir):
    """With the core in its own process, the frontend builds every step's outputs: in a fresh
    process, building the engine freezes what loading made and raises the thresholds (with
    Python's defaults its full collections paused batch-256 decode for 70-94 ms a run)."""
    script = (f"import gc; from mlxr import LLM; llm = LLM({model_dir!r}, engine_process=True); "
              "print('GC', *gc.get_threshold(), gc.get_freeze_count(), flush=True); llm.shutdown()")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("GC "))
    *thresholds, frozen = map(int, line.split()[1:])
    from mlxr.engine.core.gc_tuning import GC_THRESHOLDS

    assert all(now >= want for now, want in zip(thresholds, GC_THRESHOLDS))
    assert frozen > 1000  # the tokenizer's and the modules' objects


def _health_within(url: str, status: int, seconds: float) -> httpx.Response:
    deadline = time.monotonic() + seconds
    while True:
        health = httpx.get(url + "/health", timeout=5)
        if health.status_code == status or time.monotonic() > deadline:
            assert health.status_code == status, health.text
            return health
        time.sleep(0.05)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if "mlxr.engine.core.core_proc" in Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")]


@pytest.mark.gpu
def test_the_core_process_on_cuda_gives_the_in_process_tokens(model_dir):
    import torch

    prompts = [[5, 6, 7, 8], list(range(10, 90)), [3] * 200]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    inproc = LLM(model_dir, dtype=torch.bfloat16, device="cuda", engine_process=False)
    want = [o.outputs[0].token_ids for o in inproc.generate(prompts, params)]
    del inproc
    # engine_process=None: the engine's own choice, a process of its own on CUDA
    proc = LLM(model_dir, dtype=torch.bfloat16, device="cuda", engine_process=None)
    try:
        assert proc.loaded is None
        assert [o.outputs[0].token_ids for o in proc.generate(prompts, params)] == want
        assert proc.engine.stats().runtime_compiles == 0
    finally:
        proc.shutdown()
