"""A model's own sampling defaults reach every API where a request sets none: a model whose
generation_config.json asks for top_k 1 answers every seed alike (as temperature 0 does) on
OpenAI chat, completions, Responses, Anthropic and Ollama chat, while the same weights without
it sample; a request's own values still win; /api/show lists the defaults in force."""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import anthropic
import ollama
import openai
import pytest
from model_fixtures import fixture_model
from server_harness import running_server

SEEDS = (1, 2, 3)
N = 12


def _model_dir(root: Path, name: str, sampling: dict | None) -> Path:
    target = root / name
    shutil.copytree(fixture_model("tiny-llama").hf_dir, target)
    if sampling is not None:
        config = json.loads((target / "generation_config.json").read_text())
        (target / "generation_config.json").write_text(json.dumps({**config, "do_sample": True, **sampling}))
    return target


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    models = tmp_path_factory.mktemp("models")
    picky = _model_dir(models, "picky", {"temperature": 0.7, "top_k": 1})
    plain = _model_dir(models, "plain", None)
    with running_server(tmp_path_factory.mktemp("home"), "--model", str(picky), "--model", str(plain)) as u:
        yield u


def _name(url: str, prefix: str) -> str:
    return next(m.model for m in ollama.Client(host=url).list().models if m.model.startswith(prefix))


def _chat(url: str, model: str, **extra) -> set[str]:
    c = openai.OpenAI(base_url=url + "/v1", api_key="x")
    return {c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=N,
                                      seed=s, **extra).choices[0].message.content for s in SEEDS}


def test_openai_chat_takes_the_models_top_k(url: str) -> None:
    picky, plain = _name(url, "picky"), _name(url, "plain")
    greedy = _chat(url, picky, temperature=0)
    assert _chat(url, picky) == greedy and len(greedy) == 1
    assert len(_chat(url, plain)) > 1  # the same weights without the default sample
    assert len(_chat(url, picky, extra_body={"top_k": 0})) > 1  # the request's value wins


def test_completions_and_responses_take_it(url: str) -> None:
    picky = _name(url, "picky")
    c = openai.OpenAI(base_url=url + "/v1", api_key="x")
    texts = {c.completions.create(model=picky, prompt="Once", max_tokens=N, seed=s).choices[0].text for s in SEEDS}
    assert len(texts) == 1
    replies = {c.responses.create(model=picky, input="hi", max_output_tokens=N).output_text for _ in SEEDS}
    assert len(replies) == 1


def test_anthropic_and_ollama_take_it(url: str) -> None:
    picky = _name(url, "picky")
    a = anthropic.Anthropic(base_url=url, api_key="x")
    texts = {a.messages.create(model=picky, max_tokens=N, messages=[{"role": "user", "content": "hi"}])
             .content[0].text for _ in SEEDS}
    assert len(texts) == 1
    o = ollama.Client(host=url)
    said = {o.chat(picky, [{"role": "user", "content": "hi"}], options={"num_predict": N, "seed": s}).message.content
            for s in SEEDS}
    assert len(said) == 1


def test_show_lists_the_defaults_in_force(url: str) -> None:
    show = ollama.Client(host=url).show(_name(url, "picky"))
    lines = show.parameters.splitlines()
    assert "top_k 1" in lines and "temperature 0.7" in lines
    assert show.modelinfo["mlxr.sampling_sources"] == {"temperature": "generation_config.json",
                                                       "top_k": "generation_config.json"}
