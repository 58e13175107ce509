"""Model loading and unloading racing requests, against a real `mlxr serve` subprocess.

* keep_alive 0 requests (which unload the model) racing generate requests on the same model:
  a model is never unloaded from under a request that holds it, and a request the engine
  still fails under (a shutdown) is a 503, never a 500.
* a name re-pointed at another model (/api/create, /api/copy) serves the new model on its next
  request, once the old one's requests end; a settings-only change keeps the loaded engine."""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from model_fixtures import fixture_model
from server_harness import running_server, server_log

LLAMA = fixture_model("tiny-llama")
QWEN2 = fixture_model("tiny-qwen2")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def base_url(home: Path) -> Iterator[str]:
    with running_server(home, "--model", str(LLAMA.gguf_path)) as url:
        yield url


def _model_name(base_url: str) -> str:
    stem = LLAMA.gguf_path.stem.lower()
    names = [m["name"] for m in httpx.get(base_url + "/api/tags").json()["models"]]
    return next(n for n in names if n.startswith(stem))


async def _burst(base_url: str, model: str, rounds: int, budget_s: float) -> Counter:
    gen = {"model": model, "prompt": "hi", "stream": False, "options": {"num_predict": 5}}
    unload = {"model": model, "keep_alive": 0}

    async def post(body: dict, delay: float) -> tuple[str, int, str]:
        await asyncio.sleep(delay)
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as c:  # a connection each
            r = await c.post("/api/generate", json=body)
        return ("G" if "prompt" in body else "K"), r.status_code, "" if r.status_code == 200 else r.text[:120]

    seen: Counter = Counter()
    deadline = time.monotonic() + budget_s
    for _ in range(rounds):
        seen.update(await asyncio.gather(*[post(unload if j % 3 else gen, 0) for j in range(24)]))
        if time.monotonic() > deadline or any(status >= 500 and status != 503 for _, status, _ in seen):
            break
    return seen


def test_keep_alive_0_never_unloads_under_a_request(base_url: str) -> None:
    model = _model_name(base_url)
    seen = asyncio.run(_burst(base_url, model, rounds=60, budget_s=8.0))
    bad = {k: v for k, v in seen.items() if k[1] not in (200, 503)}
    assert not bad, f"statuses other than 200/503: {bad} (all: {dict(seen)})"
    generated = sum(v for (kind, status, _), v in seen.items() if kind == "G" and status == 200)
    assert generated > 0, dict(seen)
    # The model still answers afterwards.
    r = httpx.post(base_url + "/api/generate", json={"model": model, "prompt": "hi", "stream": False,
                                                     "options": {"num_predict": 2}}, timeout=60)
    assert r.status_code == 200, r.text


def _post(base_url: str, path: str, body: dict) -> httpx.Response:
    r = httpx.post(base_url + path, json=body, timeout=60)
    assert r.status_code == 200, (path, body, r.text)
    return r


def _generate(base_url: str, model: str) -> dict:
    return _post(base_url, "/api/generate", {"model": model, "prompt": "hello", "stream": False,
                                             "options": {"num_predict": 3}}).json()


def _create(base_url: str, model: str, source: str, **settings) -> None:
    _post(base_url, "/api/create", {"model": model, "from": source, "stream": False, **settings})


def _ps(base_url: str, model: str) -> list[dict]:
    return [m for m in httpx.get(base_url + "/api/ps").json()["models"] if m["name"] == model]


def _tag(base_url: str, model: str) -> dict:
    return next(m for m in httpx.get(base_url + "/api/tags").json()["models"] if m["name"] == model)


def _tokens(base_url: str, model: str) -> list[int]:
    return _post(base_url, "/admin/tokenize", {"model": model, "text": "hello world, 123"}).json()["tokens"]


def _loads(home: Path, model: str) -> int:
    return server_log(home).count(f"loaded model {model} in")


def _check_served(base_url: str, model: str, family: str, twin: str) -> None:
    """`model` runs the model of its registry record: /api/ps agrees with /api/tags, and its
    tokens are those of `twin` (another name of the same files)."""
    (entry,) = _ps(base_url, model)
    assert entry["details"]["family"] == family
    assert entry["digest"] == _tag(base_url, model)["digest"] == _tag(base_url, twin)["digest"]
    assert _tokens(base_url, model) == _tokens(base_url, twin)


def test_repointed_name_serves_the_new_model(base_url: str, home: Path) -> None:
    _create(base_url, "rp-llama", str(LLAMA.gguf_path))
    _create(base_url, "rp-qwen2", str(QWEN2.hf_dir))
    assert _tokens(base_url, "rp-llama:latest") != _tokens(base_url, "rp-qwen2:latest")  # tells them apart
    _create(base_url, "st", str(LLAMA.gguf_path))
    _generate(base_url, "st")
    _check_served(base_url, "st:latest", "llama", "rp-llama:latest")

    # A request in flight on the old model when the name moves ends normally.
    with httpx.Client(base_url=base_url, timeout=60) as c, c.stream(
            "POST", "/api/generate", json={"model": "st", "prompt": "hello", "options": {"num_predict": 120}}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(lines)
        _create(base_url, "st", str(QWEN2.hf_dir))
        assert _generate(base_url, "st")["done"] is True
        _check_served(base_url, "st:latest", "qwen2", "rp-qwen2:latest")
        chunks = [first, *lines]
    final = json.loads(chunks[-1])
    assert final["done"] is True and "error" not in final, chunks[-3:]
    assert not any("error" in json.loads(c) for c in chunks)

    # Settings only (the same files): the loaded engine stays.
    loads = _loads(home, "st:latest")
    _create(base_url, "st", "st", system="Answer briefly.")
    _generate(base_url, "st")
    _check_served(base_url, "st:latest", "qwen2", "rp-qwen2:latest")
    assert _loads(home, "st:latest") == loads

    # /api/copy over a loaded name re-points it too.
    _post(base_url, "/api/copy", {"source": "rp-llama", "destination": "st"})
    _generate(base_url, "st")
    _check_served(base_url, "st:latest", "llama", "rp-llama:latest")
    assert _loads(home, "st:latest") == loads + 1

    # The replaced engines were shut down (none left running beside the served one).
    deadline = time.monotonic() + 10
    while server_log(home).count("unloaded model st:latest") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server_log(home).count("unloaded model st:latest") >= 2
