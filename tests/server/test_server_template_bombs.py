"""Issue #16 D2 in the real server: a model whose chat template runs away (for ever, or
building gigabytes) answers a 400 in bounded time, and seven such requests in flight leave
/health, the registry routes and other chats answering, and SIGTERM still stops the process."""
from __future__ import annotations

import json
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from model_fixtures import fixture_model
from server_harness import server_process, stop_server

# The first message picks the runaway; anything else renders normally.
TEMPLATE = (
    "{% set kind = messages[0]['content'] %}"
    "{% if kind == 'loop' %}{% set s = 'x' * 1000000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}"
    "{% elif kind == 'power' %}{{ ((2**4000)**4000)**4000 }}"
    "{% elif kind == 'format' %}{{ '%01000000000d' % 1 }}"
    "{% else %}{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% endif %}"
)
BOMBS = ("loop", "power", "format")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "bomb-template"
    shutil.copytree(fixture_model("tiny-llama").hf_dir, path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return path


def chat(base_url: str, content: str) -> httpx.Response:
    body = {"model": "bomb-template", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
    return httpx.post(base_url + "/v1/chat/completions", json=body, timeout=120)


def timed(fn, *args) -> tuple[float, object]:
    t0 = time.monotonic()
    result = fn(*args)
    return time.monotonic() - t0, result


def test_each_runaway_is_a_400_in_bounded_time(tmp_path, model_dir):
    with server_process(tmp_path / "home", "--model", str(model_dir)) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for kind in BOMBS:
            t0 = time.monotonic()
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(model="bomb-template", max_tokens=2,
                                               messages=[{"role": "user", "content": kind}])
            assert "chat template" in e.value.message, kind
            assert time.monotonic() - t0 < 10, kind
        ok = client.chat.completions.create(model="bomb-template", max_tokens=2,
                                            messages=[{"role": "user", "content": "hello"}])
        assert ok.choices[0].finish_reason in ("stop", "length")


def test_seven_in_flight_leave_the_server_healthy(tmp_path, model_dir):
    with server_process(tmp_path / "home", "--model", str(model_dir)) as (url, proc):
        with ThreadPoolExecutor(8) as pool:
            bombs = [pool.submit(timed, chat, url, BOMBS[i % 3]) for i in range(7)]
            time.sleep(0.5)  # all seven are rendering or queued to render
            for _ in range(5):
                took, r = timed(httpx.get, url + "/health")
                assert r.status_code == 200 and took < 1.0, took
                took, r = timed(httpx.get, url + "/api/tags")
                assert r.status_code == 200 and took < 2.0, took
            for future in bombs:
                took, r = future.result(timeout=60)
                assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]
                assert took < 30, took
        assert chat(url, "hello").status_code == 200
        # SIGTERM with seven runaways in flight: the process still exits, on its own.
        with ThreadPoolExecutor(8) as pool:
            for i in range(7):
                pool.submit(chat, url, BOMBS[i % 3])
            time.sleep(0.5)
            took, code = timed(stop_server, proc, 30.0)
        assert code in (0, -signal.SIGTERM), (code, took)  # not the SIGKILL fallback of stop_server
