"""Ollama's num_thread through the official client: it sets the loaded model's CPU threads from
the request on (as Ollama sets its runner's at load), a request without it restores the
load-time default, and a value out of range is a 400 naming the field."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest
from model_fixtures import fixture_model
from server_harness import server_log, tiny_llama_server

OPTS = {"temperature": 0, "num_predict": 3}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def client(home: Path) -> Iterator[ollama.Client]:
    with tiny_llama_server(home, "--threads", "2") as url:
        yield ollama.Client(host=url, timeout=60)


@pytest.fixture(scope="module")
def name(client: ollama.Client) -> str:
    stem = fixture_model("tiny-llama").gguf_path.stem.lower()
    return next(m.model for m in client.list().models if m.model.startswith(stem))


def test_num_thread_sets_the_models_threads_and_the_default_comes_back(client, name, home) -> None:
    want = client.generate(name, "Once upon a time", options=OPTS).response
    assert "CPU threads of this model set to" not in server_log(home)
    one = client.generate(name, "Once upon a time", options={**OPTS, "num_thread": 1})
    assert one.response == want  # the same greedy tokens on one thread
    assert server_log(home).count("CPU threads of this model set to 1") == 1
    client.chat(name, [{"role": "user", "content": "hi"}], options={**OPTS, "num_thread": 1})
    assert server_log(home).count("CPU threads of this model set to 1") == 1  # already 1: nothing to do
    client.generate(name, "Once upon a time", options=OPTS)
    assert server_log(home).count("CPU threads of this model set to 2") == 1  # back to --threads


@pytest.mark.parametrize("bad", [-1, 4096])
def test_num_thread_out_of_range_is_a_400(client, name, bad: int) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        client.generate(name, "hi", options={**OPTS, "num_thread": bad})
    assert err.value.status_code == 400 and "num_thread" in err.value.error
