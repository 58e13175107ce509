"""Issue #16 D4, D6, D8, D9, D10 and its minor items, each reproduced against a real server:
the right 4xx naming the field, never a 500, and the server answering throughout."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import ollama
import openai
import pytest


@pytest.fixture(scope="module")
def base_url(shared_tiny_llama_url: str):
    return shared_tiny_llama_url  # tests/server/conftest.py


@pytest.fixture(scope="module")
def name(base_url) -> str:
    return httpx.get(base_url + "/v1/models").json()["data"][0]["id"]


@pytest.fixture(scope="module")
def client(base_url) -> ollama.Client:
    return ollama.Client(host=base_url, timeout=60)


def post_raw(base_url: str, path: str, body: str) -> httpx.Response:
    """httpx's json= cannot encode a lone surrogate; the JSON escape can."""
    return httpx.post(base_url + path, content=body.encode(), headers={"Content-Type": "application/json"}, timeout=60)


def error_text(r: httpx.Response) -> str:
    err = r.json()["error"]
    return err["message"] if isinstance(err, dict) else err


def expect_400(r: httpx.Response, *words: str) -> None:
    assert r.status_code == 400, r.text
    for word in words:
        assert word in error_text(r), (word, r.text)


# --- D4: a huge prompt is refused by its length before tokenizing, off the event loop -------

def test_huge_prompt_is_refused_fast_and_health_keeps_answering(base_url, name):
    huge = "hello world, " * 600_000  # 7.8 MB: tokenizing it took 25 s on this machine
    calls = [("/v1/completions", {"model": name, "prompt": huge, "max_tokens": 1}, "prompt"),
             ("/v1/embeddings", {"model": name, "input": huge}, "input"),
             ("/api/embed", {"model": name, "input": [huge], "truncate": False}, "input.0"),
             ("/api/embeddings", {"model": name, "prompt": huge}, "prompt")]
    # Encoded up front so this process's threads do not hold the GIL while /health is timed.
    bodies = [json.dumps(body).encode() for _, body, _ in calls]
    headers = {"Content-Type": "application/json"}
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(httpx.post, base_url + path, content=body, headers=headers, timeout=120)
                   for (path, _, _), body in zip(calls, bodies)]
        worst = 0.0
        while not all(f.done() for f in futures):
            t0 = time.monotonic()
            assert httpx.get(base_url + "/health", timeout=30).status_code == 200
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.05)
    assert worst < 2.0, worst  # before: each prompt held the event loop for its 25 s of tokenizing
    for (_, _, field), future in zip(calls, futures):
        expect_400(future.result(), field, "characters", "256")


# --- D6: a lone surrogate is a 400 naming the field on every route that takes text ----------

@pytest.mark.parametrize("path,body,field", [
    ("/v1/chat/completions", '{"model": "%s", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
     "messages.0.content"),
    ("/v1/completions", '{"model": "%s", "prompt": "a\\ud800b", "max_tokens": 1}', "prompt"),
    ("/v1/completions", '{"model": "%s", "prompt": ["ok", "a\\udc00"], "max_tokens": 1}', "prompt"),
    ("/v1/embeddings", '{"model": "%s", "input": "a\\ud800b"}', "input"),
    ("/api/generate", '{"model": "%s", "prompt": "a\\ud800b", "stream": false}', "prompt"),
    ("/api/generate", '{"model": "%s", "prompt": "a", "system": "\\udfff", "stream": false}', "system"),
    ("/api/chat", '{"model": "%s", "messages": [{"role": "user", "content": "a\\ud800b"}], "stream": false}',
     "messages.0.content"),
    ("/api/embed", '{"model": "%s", "input": "a\\ud800b"}', "input"),
    ("/api/embeddings", '{"model": "%s", "prompt": "a\\ud800b"}', "prompt"),
    ("/v1/chat/completions", '{"model": "%s", "messages": [{"role": "user", "content": "a", "extra": "\\ud800"}]}',
     "messages.0"),
])
def test_lone_surrogate_is_a_400_naming_the_field(base_url, name, path, body, field):
    r = post_raw(base_url, path, body % name)
    expect_400(r, field, "surrogate")
    # A proper pair (U+1F600) is fine.
    ok = post_raw(base_url, "/v1/completions", '{"model": "%s", "prompt": "a\\ud83d\\ude00b", "max_tokens": 1}' % name)
    assert ok.status_code == 200, ok.text


# --- D8 and keep_alive: true ------------------------------------------------------------------

def test_huge_keep_alive_means_forever_and_ps_keeps_working(client, name):
    assert client.generate(model=name, prompt="hi", keep_alive=1e12, options={"num_predict": 1}).done
    models = {m.model: m for m in client.ps().models}
    assert models[name].expires_at.year == 9999
    client.generate(model=name, prompt="", keep_alive="5m")  # back to an ordinary expiry
    assert client.ps().models


def test_keep_alive_true_is_refused(base_url, name):
    r = httpx.post(base_url + "/api/generate", json={"model": name, "prompt": "x", "keep_alive": True})
    expect_400(r, "keep_alive")


# --- D9: inputs that used to reach a 500 -----------------------------------------------------

def test_logit_bias_key_that_isdigit_accepts(base_url, name):
    for key in ("²", "٣", "1²"):
        body = {"model": name, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "logit_bias": {key: 1}}
        expect_400(httpx.post(base_url + "/v1/chat/completions", json=body), "logit_bias")


@pytest.mark.parametrize("ref", ["~nosuchuser/x.gguf", "/" + "a" * 300 + ".gguf", "/tmp/" + "b" * 300,
                                 "/" + "c/" * 3000 + "x.gguf"])
def test_create_and_pull_with_unusable_paths(base_url, ref):
    for path, body, field in (("/api/create", {"model": "made", "from": ref, "stream": False}, "from"),
                              ("/api/pull", {"model": ref, "stream": False}, "model")):
        expect_400(httpx.post(base_url + path, json=body, timeout=60), field)


@pytest.mark.parametrize("ref", ["pypi:evil.tar.gz", "pypi:evil.whl==1.0", "pypi:./evil", "pypi:evil-"])
def test_pull_refuses_a_pypi_name_that_is_not_a_package_name(base_url, ref):
    expect_400(httpx.post(base_url + "/api/pull", json={"model": ref, "stream": False}, timeout=60), "model")


# --- D10: no file-existence oracle -----------------------------------------------------------

def test_create_says_the_same_for_missing_and_existing_files(base_url, tmp_path):
    text_file = tmp_path / "notes.gguf"
    text_file.write_text("not a model")
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    (tmp_path / "emptydir").mkdir()
    secret = tmp_path / "secret.gguf"
    secret.write_bytes(b"x")
    secret.chmod(0)
    answers = set()
    for ref in ("/etc/passwd", "/etc/no-such-file", str(plain), str(text_file), str(tmp_path / "emptydir"), str(tmp_path / "nothing"),
                "/root/.ssh/id_rsa", str(secret), str(tmp_path / "missing.gguf")):
        for stream in (False, True):
            r = httpx.post(base_url + "/api/create", json={"model": "probe", "from": ref, "stream": stream}, timeout=60)
            text = r.text.replace(ref, "PATH")
            answers.add((r.status_code, text) if not stream else text.splitlines()[-1])
    assert len(answers) == 2, answers  # one answer streamed, one not: the path never matters


# --- Minor items -----------------------------------------------------------------------------

def test_logprobs_false_is_not_zero(base_url, name):
    r = httpx.post(base_url + "/v1/completions", json={"model": name, "prompt": "x", "max_tokens": 1, "logprobs": False})
    expect_400(r, "logprobs")


def test_prompt_and_input_limits_are_named(base_url, name):
    r = httpx.post(base_url + "/v1/completions", json={"model": name, "prompt": ["x"] * 65, "max_tokens": 1})
    expect_400(r, "prompt", "64")
    r = httpx.post(base_url + "/api/embed", json={"model": name, "input": ["x"] * 257})
    expect_400(r, "input", "256")
    assert len(httpx.post(base_url + "/api/embed", json={"model": name, "input": ["x"] * 3}).json()["embeddings"]) == 3


def test_openapi_declares_security_and_error_answers(base_url, name):
    schema = httpx.get(base_url + "/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearerAuth"] == {"type": "http", "scheme": "bearer"}
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    assert {"400", "403", "413", "415", "503"} <= set(chat["responses"]) and "422" not in chat["responses"]
    assert {"bearerAuth": []} in chat["security"]
    assert "security" not in schema["paths"]["/health"]["get"]
    # The declared 400 is what a bad body gets.
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=name, messages=[], max_tokens=1)


def test_still_serving(client, name):
    assert client.generate(model=name, prompt="after", options={"num_predict": 2}).done
