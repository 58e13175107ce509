"""LoRA adapters served by a real `mlxr serve` through the official openai client: named as the
request's `model` (listed in /v1/models with their base as parent), loaded and unloaded at run
time (vLLM's routes and errors) while other requests stream, losing none of them; the adapters
running appear in vllm:lora_requests_info."""
from __future__ import annotations

import threading
from pathlib import Path

import httpx
import openai
import pytest
import torch

from lora_fixtures import peft_adapter
from model_fixtures import fixture_model
from server_harness import running_server

LLAMA = fixture_model("tiny-llama")
PROMPT = [7, 300, 45, 99, 12, 250, 3, 77]


@pytest.fixture(scope="module")
def adapters() -> dict[str, Path]:
    return {spec: peft_adapter(LLAMA.hf_dir, spec) for spec in ("r4-qv", "r8-all", "r2-ko")}


@pytest.fixture(scope="module")
def server(tmp_path_factory, adapters):
    home = tmp_path_factory.mktemp("home")
    with running_server(home, "--model", str(LLAMA.hf_dir), "--dtype", "float32", "--max-loras", "2",
                        "--lora", f"qv={adapters['r4-qv']}") as url:
        yield url


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def _base(url: str) -> str:
    return next(m.id for m in _client(url).models.list().data if getattr(m, "parent", None) is None)


def _complete(url: str, model: str, n: int = 8) -> list[str]:
    out = _client(url).completions.create(model=model, prompt=PROMPT, max_tokens=n, temperature=0,
                                          extra_body={"ignore_eos": True}, logprobs=0)
    return out.choices[0].logprobs.tokens


def test_adapter_is_a_model_with_its_base_as_parent(server, adapters):
    cards = {m.id: m for m in _client(server).models.list().data}
    assert cards["qv"].parent == _base(server) and cards["qv"].root == str(adapters["r4-qv"].resolve())
    assert _client(server).models.retrieve("qv").parent == _base(server)


def test_adapter_requests_equal_the_offline_api(server, adapters):
    from mlxr import LLM, SamplingParams

    llm = LLM(str(LLAMA.hf_dir), dtype=torch.float32, enable_lora=True, warm_up=False)
    try:
        llm.load_lora("qv", str(adapters["r4-qv"]))
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        want = llm.generate([PROMPT], params, lora="qv")[0].outputs[0].text
        base = llm.generate([PROMPT], params)[0].outputs[0].text
    finally:
        llm.shutdown()
    assert "".join(_complete(server, "qv")) == want
    assert "".join(_complete(server, _base(server))) == base != want


def test_load_and_unload_at_run_time_lose_no_request(server, adapters):
    results: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def stream(key: str, model: str) -> None:
        try:
            chunks = _client(server).completions.create(model=model, prompt=PROMPT, max_tokens=48, temperature=0,
                                                         stream=True, extra_body={"ignore_eos": True})
            results[key] = [c.choices[0].finish_reason for c in chunks if c.choices]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=stream, args=(f"{m}-{i}", m)) for i in range(3) for m in ("qv", _base(server))]
    for t in threads:
        t.start()
    r = httpx.post(server + "/v1/load_lora_adapter", json={"lora_name": "all", "lora_path": str(adapters["r8-all"])},
                   timeout=60)
    assert r.status_code == 200 and "added successfully" in r.text
    extra = [threading.Thread(target=stream, args=(f"all-{i}", "all")) for i in range(2)]
    for t in extra:
        t.start()
    r = httpx.post(server + "/v1/unload_lora_adapter", json={"lora_name": "qv"}, timeout=60)
    assert r.status_code == 200 and "removed successfully" in r.text
    for t in threads + extra:
        t.join(120)
    assert not errors
    assert len(results) == 8 and all(r[-1] == "length" for r in results.values())
    with pytest.raises(openai.NotFoundError):
        _complete(server, "qv")
    assert "qv" not in {m.id for m in _client(server).models.list().data}
    assert len(_complete(server, "all")) == 8
    # vLLM's answers to loading twice and unloading what is not loaded
    again = httpx.post(server + "/v1/load_lora_adapter", json={"lora_name": "all", "lora_path": str(adapters["r8-all"])})
    assert again.status_code == 400 and "already been loaded" in again.text
    gone = httpx.post(server + "/v1/unload_lora_adapter", json={"lora_name": "qv"})
    assert gone.status_code == 404 and "cannot be found" in gone.text
    missing = httpx.post(server + "/v1/load_lora_adapter", json={"lora_name": "x"})
    assert missing.status_code == 400 and "must be provided" in missing.text


def test_running_adapters_in_lora_requests_info(server, adapters):
    r = httpx.post(server + "/v1/load_lora_adapter", json={"lora_name": "ko", "lora_path": str(adapters["r2-ko"])})
    assert r.status_code == 200
    done = threading.Event()

    def long_ones() -> None:  # the context is 256 tokens: several at once keep the adapter running a while
        threads = [threading.Thread(target=lambda: _client(server).completions.create(
            model="ko", prompt=PROMPT, max_tokens=240, temperature=0, extra_body={"ignore_eos": True}))
            for _ in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        done.set()

    t = threading.Thread(target=long_ones)
    t.start()
    seen = ""
    for _ in range(200):
        text = httpx.get(server + "/metrics").text
        line = next((ln for ln in text.splitlines() if ln.startswith("vllm:lora_requests_info{")), "")
        if 'running_lora_adapters="ko"' in line:
            seen = line
            break
        if done.is_set():
            break
    t.join(120)
    assert 'max_lora="2"' in seen and 'running_lora_adapters="ko"' in seen
