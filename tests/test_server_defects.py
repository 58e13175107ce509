"""Defects of the fuzzing pass (2026-11-28), each against a real `mlxr serve` on 127.0.0.1."""
from __future__ import annotations

import httpx
import openai
import pytest
from server_harness import tiny_llama_server

MAX_WAITING = 2


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with tiny_llama_server(home, "--max-waiting", str(MAX_WAITING)) as url:
        yield url


@pytest.fixture(scope="module")
def model(base_url) -> str:
    return httpx.get(base_url + "/v1/models").json()["data"][0]["id"]


@pytest.fixture(scope="module")
def client(base_url):
    c = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=60)
    yield c
    c.close()


def test_prompt_batch_over_queue_limit_is_a_400_naming_the_limit(client, model):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model, prompt=["a", "b", "c"], max_tokens=2)
    assert err.value.status_code == 400
    assert "--max-waiting" in err.value.message and str(MAX_WAITING) in err.value.message
    assert err.value.body["param"] == "prompt"
    # A batch at the limit is still served.
    ok = client.completions.create(model=model, prompt=["a", "b"], max_tokens=2)
    assert len(ok.choices) == 2
