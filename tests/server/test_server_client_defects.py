"""Protocol defects real clients met, against a real server with the official clients: Ollama's
/api/show capabilities (llm-ollama refuses tools without "tools"), vLLM's tokenizer routes
(lm-evaluation-harness's remote tokenizer), Chat Completions' cached_tokens, Responses and
forced tool calls cut by max tokens, and a log line for every error response.

The model is tiny-llama3 given a template that renders tools (the Hermes format) and knows
reasoning markers."""
from __future__ import annotations

import json
import shutil

import httpx
import ollama
import openai
import pytest
from model_fixtures import fixture_model
from server_harness import running_server, server_log

TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}. "
    "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif %}")
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "minLength": 400}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def base_url(tmp_path_factory, home):
    model_dir = tmp_path_factory.mktemp("tooled") / "model"
    shutil.copytree(fixture_model("tiny-llama3").hf_dir, model_dir)
    config_path = model_dir / "tokenizer_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "chat_template": TEMPLATE}))
    with running_server(home, "--model", str(model_dir)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    c = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    yield c
    c.close()


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def test_show_reports_tools_and_thinking_from_the_template(base_url, model, shared_tiny_llama_url):
    assert ollama.Client(host=base_url).show(model).capabilities == ["completion", "tools", "thinking"]
    plain = ollama.Client(host=shared_tiny_llama_url)
    name = plain.list().models[0].model
    assert plain.show(name).capabilities == ["completion"]  # its template renders no tools

