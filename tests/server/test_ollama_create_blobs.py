"""Ollama's blob upload and /api/create with files, system, template, parameters and messages,
driven by the official `ollama` client against a real `mlxr serve` subprocess."""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest
from model_fixtures import fixture_model
from server_harness import tiny_llama_server

FIXTURE = fixture_model("tiny-llama")
SYSTEM = "You are a pirate. Answer in one word."
GREEDY = {"temperature": 0, "num_predict": 8, "seed": 1}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    home = tmp_path_factory.mktemp("home")
    with tiny_llama_server(home) as url:
        yield url, home


@pytest.fixture(scope="module")
def client(server: tuple[str, Path]) -> ollama.Client:
    return ollama.Client(host=server[0], timeout=60)


@pytest.fixture(scope="module")
def base(client: ollama.Client) -> str:
    return next(m.model for m in client.list().models if m.model.startswith(FIXTURE.gguf_path.stem.lower()))


def test_create_from_a_pushed_blob_applies_the_system_prompt(client: ollama.Client, base: str, server) -> None:
    digest = client.create_blob(FIXTURE.gguf_path)  # HEAD-less upload: POST /api/blobs/<digest>
    assert (server[1] / "blobs" / digest.replace(":", "-")).is_file()
    assert httpx.head(f"{server[0]}/api/blobs/{digest}").status_code == 200
    done = client.create(model="pirate", files={FIXTURE.gguf_path.name: digest}, system=SYSTEM)
    assert done.status == "success"
    assert f'SYSTEM """{SYSTEM}"""' in client.show("pirate").modelfile
    assert _show(server[0], "pirate")["system"] == SYSTEM  # the client's ShowResponse drops it
    ask = [{"role": "user", "content": "Who are you?"}]
    created = client.chat(model="pirate", messages=ask, options=GREEDY)
    explicit = client.chat(model=base, messages=[{"role": "system", "content": SYSTEM}, *ask], options=GREEDY)
    plain = client.chat(model=base, messages=ask, options=GREEDY)
    assert created.prompt_eval_count == explicit.prompt_eval_count > plain.prompt_eval_count
    assert created.message.content == explicit.message.content
    # The request's own system message wins over the model's.
    own = client.chat(model="pirate", messages=[{"role": "system", "content": "x"}, *ask], options=GREEDY)
    assert own.prompt_eval_count < created.prompt_eval_count


def _show(url: str, model: str) -> dict:
    r = httpx.post(f"{url}/api/show", json={"model": model})
    assert r.status_code == 200
    return r.json()


def test_create_from_a_model_with_template_parameters_and_messages(client: ollama.Client, base: str, server) -> None:
    history = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Ahoy"}]
    client.create(model="talker", from_=base, template="{{ .System }}|{{ .Prompt }}",
                  parameters={"num_predict": 3, "temperature": 0, "stop": ["zz"]}, messages=history)
    shown = client.show("talker")
    assert shown.template == "{{ .System }}|{{ .Prompt }}"
    assert "num_predict 3" in shown.parameters and 'stop "zz"' in shown.parameters
    assert [m["content"] for m in _show(server[0], "talker")["messages"]] == ["Hello there", "Ahoy"]
    # Parameters are defaults: no options -> 3 tokens; a request's own num_predict wins.
    assert client.generate(model="talker", prompt="hi").eval_count == 3
    assert client.generate(model="talker", prompt="hi", options={"num_predict": 5, "temperature": 0}).eval_count == 5
    # The template shapes /api/generate: "|hi" (no system), BOS added by the tokenizer.
    raw = client.generate(model=base, prompt="|hi", raw=True, options={"num_predict": 1})
    assert client.generate(model="talker", prompt="hi").prompt_eval_count == raw.prompt_eval_count
    ask = [{"role": "user", "content": "And now?"}]
    with_history = client.chat(model=base, messages=[*history, *ask], options=GREEDY)
    created = client.chat(model="talker", messages=ask, options=GREEDY)
    assert created.prompt_eval_count == with_history.prompt_eval_count


def test_blob_and_create_refusals(client: ollama.Client, server) -> None:
    url, home = server
    body = b"GGUF not really a model"
    wrong = "sha256:" + "0" * 64
    r = httpx.post(f"{url}/api/blobs/{wrong}", content=body)
    assert r.status_code == 400 and "digest mismatch" in r.text
    assert httpx.head(f"{url}/api/blobs/{wrong}").status_code == 404
    assert httpx.post(f"{url}/api/blobs/sha256:xyz", content=body).status_code == 400
    assert not [p for p in (home / "blobs").iterdir() if p.name.startswith(".upload")]
    good = "sha256:" + hashlib.sha256(body).hexdigest()
    assert httpx.post(f"{url}/api/blobs/{good}", content=body).status_code == 201
    with pytest.raises(ollama.ResponseError) as broken:  # a blob that is not a loadable model
        client.create(model="broken", files={"m.gguf": good})
    assert broken.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as missing:
        client.create(model="missing", files={"m.gguf": wrong})
    assert missing.value.status_code == 400 and "push it" in str(missing.value)
    with pytest.raises(ollama.ResponseError) as bad_template:
        client.create(model="t", from_=FIXTURE.gguf_path.as_posix(), template="{{ range .Messages }}{{ end }}")
    assert bad_template.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as bad_param:
        client.create(model="t", from_=FIXTURE.gguf_path.as_posix(), parameters={"temperature": "hot"})
    assert bad_param.value.status_code == 400 and "temperature" in str(bad_param.value)
    assert "broken:latest" not in [m.model for m in client.list().models]
