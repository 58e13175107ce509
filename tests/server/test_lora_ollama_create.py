"""Ollama's /api/create with `adapters` (what `ollama create` sends for a Modelfile's ADAPTER line),
through the official ollama client: the GGUF LoRA's blob is recorded with the new model, which
then generates as its base with the adapter does; a bad adapter blob is a 400 naming it."""
from __future__ import annotations

import httpx
import ollama
import pytest

from lora_fixtures import llama_cpp_lora, peft_adapter
from model_fixtures import fixture_model
from server_harness import running_server

LLAMA = fixture_model("tiny-llama")
PROMPT = "one two three"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with running_server(home, "--model", str(LLAMA.hf_dir), "--dtype", "float32", "--enable-lora") as url:
        yield url


def _generate(client: ollama.Client, model: str) -> str:
    return client.generate(model=model, prompt=PROMPT, raw=True,
                           options={"temperature": 0, "num_predict": 8, "seed": 1}).response


def test_create_with_an_adapter_records_it_and_runs_with_it(server, tmp_path):
    adapter = peft_adapter(LLAMA.hf_dir, "r8-all")
    gguf_lora = llama_cpp_lora(adapter, LLAMA.hf_dir)
    client = ollama.Client(host=server)
    base = next(m["id"] for m in httpx.get(server + "/v1/models").json()["data"])
    digest = client.create_blob(gguf_lora)
    client.create(model="tuned", from_=base, adapters={"lora.gguf": digest})
    assert "ADAPTER" in client.show("tuned").modelfile
    r = httpx.post(server + "/v1/load_lora_adapter", json={"lora_name": "same", "lora_path": str(adapter)}, timeout=60)
    assert r.status_code == 200
    tuned, with_peft, plain = _generate(client, "tuned"), _generate(client, "same"), _generate(client, base)
    assert tuned == with_peft != plain


def test_a_bad_adapter_blob_is_a_400_naming_it(server, tmp_path):
    client = ollama.Client(host=server)
    base = next(m["id"] for m in httpx.get(server + "/v1/models").json()["data"])
    digest = client.create_blob(LLAMA.gguf_path)  # a model, not an adapter
    with pytest.raises(ollama.ResponseError) as e:
        client.create(model="broken", from_=base, adapters={"model.gguf": digest})
    assert e.value.status_code == 400 and "is not a GGUF LoRA adapter" in str(e.value)
    assert "broken" not in {m.model for m in client.list().models}
