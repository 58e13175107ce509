"""A base model (no chat template in its files) served as a new user meets it: /api/generate
sends the prompt raw, /api/show says it is a base model, and a request that sets no token bound
stops at `--max-tokens-default` on every API. The start-up banner says where everything is."""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest
from model_fixtures import fixture_model
from server_harness import server_log, server_process

BOUND = 3  # --max-tokens-default of this module's server
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
    with server_process(home, "--model", str(model), "--max-tokens-default", str(BOUND)) as (url, _):
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
    assert show.capabilities[0] == "completion"  # then tools or thinking as its template allows
    assert show.modelinfo["mlxr.chat_template"] == "model"


def test_no_bound_in_the_request_stops_at_the_default_on_ollama(client: ollama.Client, name: str) -> None:
    gen = client.generate(name, "Once upon a time", options=GREEDY)
    assert (gen.eval_count, gen.done_reason) == (BOUND, "length")
    chat = client.chat(name, [{"role": "user", "content": "Hello"}], options=GREEDY)
    assert (chat.eval_count, chat.done_reason) == (BOUND, "length")
    streamed = list(client.generate(name, "Once upon a time", options=GREEDY, stream=True))
    assert (streamed[-1].eval_count, streamed[-1].done_reason) == (BOUND, "length")


def test_no_bound_in_the_request_stops_at_the_default_on_openai(served: tuple[str, Path], name: str) -> None:
    c = openai.OpenAI(base_url=served[0] + "/v1", api_key="x", max_retries=0, timeout=60)
    chat = c.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hello"}], temperature=0)
    assert (chat.usage.completion_tokens, chat.choices[0].finish_reason) == (BOUND, "length")
    # OpenAI's own default for /v1/completions is 16 tokens; an explicit null gets the server's.
    done = c.completions.create(model=name, prompt="Once upon a time", max_tokens=None, temperature=0)
    assert (done.usage.completion_tokens, done.choices[0].finish_reason) == (BOUND, "length")
    resp = c.responses.create(model=name, input="Hello", temperature=0)
    assert resp.usage.output_tokens == BOUND and resp.status == "incomplete"
    assert resp.incomplete_details.reason == "max_output_tokens"


def test_a_bound_in_the_request_wins(client: ollama.Client, name: str) -> None:
    gen = client.generate(name, "Once upon a time", options={**GREEDY, "num_predict": BOUND + 2})
    assert gen.eval_count == BOUND + 2


def test_banner_says_where_everything_is(served: tuple[str, Path], name: str) -> None:
    """A server whose output is a file logs its banner as one JSON line among the others."""
    url, home = served
    records = [json.loads(line) for line in server_log(home).splitlines() if line.startswith("{")]
    ready = [r for r in records if r["msg"] == f"mlxr serve: ready on {url}"]
    assert len(ready) == 1
    fields = ready[0]
    assert (fields["OpenAI API"], fields["Ollama API"], fields["web UI"]) == (f"{url}/v1", url, f"{url}/ui/")
    assert fields["models"] == f"{name} (cpu)" and fields["API key"] == "not required"
    assert fields["reply bound"].startswith(f"{BOUND} tokens")
