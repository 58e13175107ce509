"""A base model (no chat template in its files) served as a new user meets it: /api/generate
sends the prompt raw and /api/show says it is a base model."""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest
from model_fixtures import fixture_model
from server_harness import server_process

GREEDY = {"temperature": 0, "repeat_penalty": 1.0}


def _base_model_dir(root: Path) -> Path:
    """The tiny Gemma 3 HF fixture without its chat template: a base model's files."""
    target = root / "base-gemma"
    shutil.copytree(fixture_model("tiny-gemma3").hf_dir, target)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    return target


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    home = tmp_path_factory.mktemp("home")
    model = _base_model_dir(tmp_path_factory.mktemp("models"))
    with server_process(home, "--model", str(model)) as (url, _):
        yield url, home


@pytest.fixture(scope="module")
def client(served: tuple[str, Path]) -> ollama.Client:
    return ollama.Client(host=served[0], timeout=60)


@pytest.fixture(scope="module")
def name(client: ollama.Client) -> str:
    return next(m.model for m in client.list().models if m.model.startswith("base-gemma"))


def test_generate_sends_a_base_models_prompt_raw(client: ollama.Client, name: str) -> None:
    prompt = "The sky is blue because"
    plain = client.generate(name, prompt, options={**GREEDY, "num_predict": 1})
    raw = client.generate(name, prompt, raw=True, options={**GREEDY, "num_predict": 1})
    assert plain.prompt_eval_count == raw.prompt_eval_count
    assert plain.response == raw.response


def test_chat_on_a_base_model_keeps_the_built_in_template(client: ollama.Client, name: str) -> None:
    prompt = "The sky is blue because"
    raw = client.generate(name, prompt, raw=True, options={**GREEDY, "num_predict": 1})
    chat = client.chat(name, [{"role": "user", "content": prompt}], options={**GREEDY, "num_predict": 1})
    assert chat.prompt_eval_count > raw.prompt_eval_count  # the turn markers around the prompt


def test_show_marks_a_base_model(client: ollama.Client, name: str) -> None:
    show = client.show(name)
    assert show.capabilities == ["completion"]
    assert show.modelinfo["mlxr.chat_template"] == "built-in"


def test_show_marks_a_chat_model(shared_tiny_llama_url: str) -> None:
    c = ollama.Client(host=shared_tiny_llama_url, timeout=60)
    show = c.show(c.list().models[0].model)
    assert show.capabilities == ["completion", "chat"]
    assert show.modelinfo["mlxr.chat_template"] == "model"
