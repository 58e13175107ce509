"""The Ollama API against a real `mlxr serve` subprocess, driven by the official `ollama`
client (and httpx where the client has no call or hides the wire format)."""
from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest
from model_fixtures import fixture_model
from server_harness import tiny_llama_server

import mlxr

FIXTURE = fixture_model("tiny-llama")
RFC3339_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
DURATIONS = ("total_duration", "prompt_eval_duration", "eval_duration")


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with tiny_llama_server(tmp_path_factory.mktemp("home")) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url: str) -> ollama.Client:
    return ollama.Client(host=base_url, timeout=60)


@pytest.fixture(scope="module")
def name(client: ollama.Client) -> str:
    names = [m.model for m in client.list().models]
    stem = FIXTURE.gguf_path.stem.lower()
    return next(n for n in names if n.startswith(stem))


def _check_final(final: ollama.GenerateResponse | ollama.ChatResponse, max_tokens: int) -> None:
    assert final.done is True
    assert final.done_reason in ("stop", "length")
    assert RFC3339_Z.fullmatch(final.created_at)
    for key in DURATIONS:
        value = getattr(final, key)
        assert isinstance(value, int) and value > 0, key
    assert isinstance(final.load_duration, int) and final.load_duration >= 0
    assert final.total_duration >= final.prompt_eval_duration + final.eval_duration
    assert final.prompt_eval_count > 0
    assert 1 <= final.eval_count <= max_tokens
    # A stop token may also fall on the last allowed position, so only "length" pins the count.
    assert final.done_reason in ("stop", "length")
    if final.done_reason == "length":
        assert final.eval_count == max_tokens
    else:
        assert final.eval_count <= max_tokens


def test_version_and_root(base_url: str) -> None:
    assert httpx.get(base_url + "/api/version").json() == {"version": mlxr.__version__}


def test_generate_whole(client: ollama.Client, name: str) -> None:
    r = client.generate(model=name, prompt="hello there", options={"num_predict": 8})
    _check_final(r, 8)
    assert r.model == name
    # context holds the prompt and output ids, so eval_count is the number of tokens made
    assert len(r.context) == r.prompt_eval_count + r.eval_count


def test_generate_streaming(client: ollama.Client, name: str) -> None:
    chunks = list(client.generate(model=name, prompt="hello", stream=True, options={"num_predict": 6}))
    *parts, final = chunks
    assert parts and all(c.done is False and RFC3339_Z.fullmatch(c.created_at) for c in parts)
    assert final.response == ""
    _check_final(final, 6)
    assert len(final.context) == final.prompt_eval_count + final.eval_count


def test_ndjson_wire_format(base_url: str, name: str) -> None:
    body = {"model": name, "prompt": "hi", "options": {"num_predict": 3}}
    with httpx.stream("POST", base_url + "/api/generate", json=body) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(x) for x in r.iter_lines() if x]
    assert [x["done"] for x in lines] == [False] * (len(lines) - 1) + [True]
    assert "response" in lines[0] and "model" in lines[0]


def test_integer_options_sent_as_whole_floats_are_taken(base_url: str, name: str) -> None:
    """JSON has one number type: Ollama takes 3.0 for an integer option (JavaScript and curl
    callers send computed values so); a fraction is a 400 naming the option."""
    body = {"model": name, "prompt": "hi", "stream": False,
            "options": {"num_predict": 3.0, "num_ctx": 256.0, "seed": 5.0}}
    r = httpx.post(base_url + "/api/generate", json=body)
    assert r.status_code == 200 and r.json()["eval_count"] == 3
    r = httpx.post(base_url + "/api/generate", json={**body, "options": {"num_predict": 2.5}})
    assert r.status_code == 400 and "num_predict" in r.json()["error"]


def test_chat_whole_and_streaming(client: ollama.Client, name: str) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = client.chat(model=name, messages=messages, options={"num_predict": 5})
    _check_final(r, 5)
    assert r.message.role == "assistant"
    *parts, final = list(client.chat(model=name, messages=messages, stream=True, options={"num_predict": 5}))
    assert all(p.message.role == "assistant" and not p.done for p in parts)
    assert final.message.content == ""
    _check_final(final, 5)


def test_num_predict_and_seed(client: ollama.Client, name: str) -> None:
    r = client.generate(model=name, prompt="count", options={"num_predict": 4})
    assert r.eval_count <= 4
    opts = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 1234, "num_predict": 12}
    a = client.generate(model=name, prompt="seeded", options=opts)
    b = client.generate(model=name, prompt="seeded", options=opts)
    assert a.response == b.response and a.context == b.context


def test_stop_cuts(client: ollama.Client, name: str) -> None:
    opts = {"temperature": 0, "num_predict": 24}
    full = client.generate(model=name, prompt="stop here", options=opts).response
    at = next((i for i, ch in enumerate(full) if i >= 3 and ch.isalnum()), None)
    if at is None:
        pytest.skip(f"greedy output {full!r} has no usable stop character")
    stop = full[at]
    r = client.generate(model=name, prompt="stop here", options={**opts, "stop": [stop]})
    assert r.response == full[: full.index(stop)]
    assert r.done_reason == "stop"


def test_raw_and_template(client: ollama.Client, name: str) -> None:
    raw = client.generate(model=name, prompt="A: b", raw=True, options={"num_predict": 2})
    templ = client.generate(model=name, prompt="b", template="{{ if .System }}S{{ end }}A: {{ .Prompt }}",
                            options={"num_predict": 2})
    assert raw.prompt_eval_count == templ.prompt_eval_count
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model=name, prompt="b", template="{{ range .Messages }}x{{ end }}")
    assert e.value.status_code == 400 and "template" in e.value.error


def test_format_json_is_accepted(client: ollama.Client, name: str) -> None:
    r = client.generate(model=name, prompt="json please", format="json", options={"num_predict": 3})
    assert r.done


def test_tags_show_ps(client: ollama.Client, name: str, base_url: str) -> None:
    client.generate(model=name, prompt="warm", options={"num_predict": 1})
    tag = next(m for m in httpx.get(base_url + "/api/tags").json()["models"] if m["model"] == name)
    assert tag["name"] == name and re.fullmatch(r"[0-9a-f]{64}", tag["digest"])
    assert tag["size"] > 0 and RFC3339_Z.fullmatch(tag["modified_at"])
    assert tag["details"]["format"] == "gguf" and tag["details"]["family"] == "llama"
    assert set(tag["details"]) >= {"parent_model", "families", "parameter_size", "quantization_level"}
    show = client.show(name)
    assert show.modelinfo["general.architecture"] == "llama"
    assert show.modelinfo["llama.context_length"] == 256
    assert show.modelinfo["llama.block_count"] == 2 and show.modelinfo["llama.embedding_length"] == 64
    assert "completion" in show.capabilities and show.template and show.details.family == "llama"
    loaded = next(m for m in client.ps().models if m.model == name)
    assert loaded.size_vram == 0 and loaded.context_length == 256 and loaded.expires_at is not None


def test_embed(client: ollama.Client, name: str, base_url: str) -> None:
    r = client.embed(model=name, input=["first text", "second"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 64
    assert math.isclose(sum(v * v for v in r.embeddings[0]), 1.0, rel_tol=1e-3)
    assert r.prompt_eval_count > 0 and r.total_duration > 0
    legacy = httpx.post(base_url + "/api/embeddings", json={"model": name, "prompt": "first text"}).json()
    assert legacy["embedding"] == pytest.approx(r.embeddings[0], abs=1e-4)


def test_embed_cuts_a_long_input_unless_truncate_is_false(client: ollama.Client, name: str) -> None:
    """Ollama's /api/embed truncates by default (the official client sends no truncate)."""
    long_text = "word " * 400  # past the fixture's 256-token context
    r = client.embed(model=name, input=long_text)
    assert len(r.embeddings) == 1 and r.prompt_eval_count == 256
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model=name, input=long_text, truncate=False)
    assert refused.value.status_code == 400 and "256" in str(refused.value)


def test_copy_and_delete(client: ollama.Client, name: str) -> None:
    assert client.copy(name, "copied:v1").status == "success"
    assert "copied:v1" in [m.model for m in client.list().models]
    assert client.delete("copied:v1").status == "success"
    assert "copied:v1" not in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("copied:v1")
    assert e.value.status_code == 404


def test_create_from_gguf_and_hf_dir(client: ollama.Client) -> None:
    lines = list(client.create(model="made-gguf", from_=str(FIXTURE.gguf_path), stream=True))
    assert lines[-1].status == "success"
    assert any(p.total and p.completed is not None for p in lines)
    assert client.create(model="made-hf", from_=str(FIXTURE.hf_dir)).status == "success"
    tags = {m.model: m for m in client.list().models}
    assert tags["made-hf:latest"].details.format == "safetensors"
    r = client.generate(model="made-hf", prompt="hf", options={"num_predict": 2}, keep_alive=0)
    assert r.done
    for created in ("made-gguf", "made-hf"):
        client.delete(created)


def test_pull_file_url(client: ollama.Client, tmp_path: Path) -> None:
    copy = tmp_path / "pulled-model.gguf"
    copy.write_bytes(FIXTURE.gguf_path.read_bytes())
    lines = list(client.pull(copy.as_uri(), stream=True))
    assert lines[-1].status == "success"
    progress = [p for p in lines if p.total]
    assert progress and progress[-1].completed == progress[-1].total == copy.stat().st_size
    assert any((p.digest or "").startswith("sha256:") for p in lines)
    assert "pulled-model:latest" in [m.model for m in client.list().models]
    client.delete("pulled-model")
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("llama3.2")
    assert e.value.status_code == 404 and "local" in e.value.error


def test_load_and_unload(client: ollama.Client, name: str) -> None:
    r = client.generate(model=name, prompt="", keep_alive="10m")
    assert r.done_reason == "load" and name in [m.model for m in client.ps().models]
    r = client.generate(model=name, prompt="bye", keep_alive=0, options={"num_predict": 2})
    assert r.done and name not in [m.model for m in client.ps().models]
    assert client.chat(model=name, messages=[]).done_reason == "load"
    assert client.chat(model=name, messages=[], keep_alive=0).done_reason == "unload"
    assert name not in [m.model for m in client.ps().models]


def test_errors(client: ollama.Client, name: str, base_url: str) -> None:
    for call in (lambda: client.generate(model="no-such-model", prompt="x"),
                 lambda: client.chat(model="no-such-model", messages=[{"role": "user", "content": "x"}])):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 404 and e.value.error == "model 'no-such-model' not found"
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model=name, prompt="x", options={"temperature": "hot"})
    assert e.value.status_code == 400 and "options.temperature" in e.value.error
    bad = [({"options": {"num_predict": 1.5}}, "options.num_predict"),
           ({"options": {"top_p": 7}}, "options.top_p"),
           ({"keep_alive": "soon"}, "keep_alive"),
           ({"prompt": "word " * 400, "truncate": False}, "256")]  # without it, cut to fit
    for extra, needle in bad:
        r = httpx.post(base_url + "/api/generate", json={"model": name, "prompt": "x", **extra})
        assert r.status_code == 400 and needle in r.json()["error"], (extra, r.text)


def _stats(base_url: str, name: str) -> dict:
    return httpx.get(base_url + "/admin/stats").json()["models"][name]


def _wait_for(check, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def long_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The long-context fixture: a reply of 2,000 tokens outlasts the disconnects below."""
    with tiny_llama_server(tmp_path_factory.mktemp("long"), fixture="tiny-llama-long") as url:
        yield url


def test_disconnect_aborts(long_url: str) -> None:
    base_url, client = long_url, ollama.Client(host=long_url, timeout=60)
    name = client.list().models[0].model
    body = {"model": name, "prompt": "long", "options": {"num_predict": 2000, "temperature": 0}}
    whole = client.generate(**body)
    assert whole.eval_count == 2000  # greedy on this random model: no early stop
    before = _stats(base_url, name)["num_aborted"]
    with httpx.stream("POST", base_url + "/api/generate", json=body) as r:
        next(r.iter_lines())
    _wait_for(lambda: _stats(base_url, name)["num_aborted"] == before + 1)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base_url + "/api/generate", json={**body, "stream": False}, timeout=whole.total_duration / 4e9)
    _wait_for(lambda: _stats(base_url, name)["num_aborted"] == before + 2)
    stats = _stats(base_url, name)
    assert stats["num_requests_running"] == 0 and stats["active_http_requests"] == 0
    assert client.generate(model=name, prompt="after", options={"num_predict": 2}).done


def test_curl_style_form_content_type_is_read_as_json(base_url: str, name: str) -> None:
    """`curl URL -d '{...}'` (Ollama's documented usage) sends a form content type."""
    import httpx

    # Greedy: Ollama's default temperature samples, and a random model's sample can end on EOS
    # before num_predict (which this test reads back to see the options were parsed).
    body = '{"model": "%s", "prompt": "Hello", "stream": false, "options": {"num_predict": 3, "temperature": 0}}' % name
    r = httpx.post(f"{base_url}/api/generate", content=body,
                   headers={"content-type": "application/x-www-form-urlencoded"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["done"] is True and r.json()["eval_count"] == 3
