"""Protocol defects real clients met, against a real server with the official clients: Ollama's
/api/show capabilities (llm-ollama refuses tools without "tools"), vLLM's tokenizer routes
(lm-evaluation-harness's remote tokenizer), Chat Completions' cached_tokens, Responses and
forced tool calls cut by max tokens, and a log line for every error response.

The model is tiny-llama3 given a template that renders tools (the Hermes format) and knows
reasoning markers."""
from __future__ import annotations

import json
import shutil

import anthropic
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
    # Its template renders no tools: the generic format describes them in the system prompt.
    assert plain.show(name).capabilities == ["completion", "tools"]


def test_vllm_tokenize_and_detokenize(base_url, model):
    text = "Hello world, 123"
    admin = httpx.post(base_url + "/admin/tokenize", json={"model": model, "text": text}).json()
    r = httpx.post(base_url + "/tokenize", json={"model": model, "prompt": text, "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == [t["id"] for t in admin["tokens"]] and body["count"] == len(body["tokens"])
    assert body["max_model_len"] > 0 and len(body["token_strs"]) == body["count"]
    back = httpx.post(base_url + "/detokenize", json={"tokens": body["tokens"]}).json()  # the default model
    assert back["prompt"].strip() == text
    chat = httpx.post(base_url + "/tokenize", json={"model": model, "messages": ASK}).json()
    rendered = httpx.post(base_url + "/detokenize", json={"model": model, "tokens": chat["tokens"]}).json()
    assert "Weather in Paris?" in rendered["prompt"] and chat["token_strs"] is None
    alone = httpx.post(base_url + "/tokenize", json={"prompt": "Weather in Paris?"}).json()
    assert chat["count"] > alone["count"]  # the template's markers around it


def test_vllm_tokenizer_info(base_url, model):
    info = httpx.get(base_url + "/tokenizer_info", params={"model": model}).json()
    assert info["tokenizer_class"] and info["chat_template"] == TEMPLATE
    assert info["model_max_length"] > 0 and "eos_token" in info and "bos_token" in info


@pytest.mark.parametrize("route, body, param", [
    ("/tokenize", {"prompt": "x" * 200_000}, "prompt"),  # the prompt bound of /v1/completions
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": ASK}, "prompt"),
    ("/detokenize", {"tokens": [1 << 30]}, "tokens"),
    ("/detokenize", {"tokens": []}, "tokens"),
])
def test_vllm_tokenizer_routes_refuse_what_is_out_of_bounds(base_url, route, body, param):
    r = httpx.post(base_url + route, json=body, timeout=60)
    assert r.status_code == 400 and param in r.json()["error"], r.text


def test_chat_usage_counts_cached_prompt_tokens(client, model):
    long = [{"role": "user", "content": "Tell me about the weather in Paris in spring. " * 4}]
    first = client.chat.completions.create(model=model, messages=long, max_tokens=2, temperature=0)
    second = client.chat.completions.create(model=model, messages=long, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens
    stream = list(client.chat.completions.create(model=model, messages=long, max_tokens=2, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert stream[-1].usage.prompt_tokens_details.cached_tokens == cached


def test_a_response_cut_by_max_output_tokens_is_incomplete_item_and_all(client, model):
    r = client.responses.create(model=model, input="Write a long story.", max_output_tokens=16, temperature=1.0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [item.status for item in r.output] == ["incomplete"]
    events = list(client.responses.create(model=model, input="Write a long story.", max_output_tokens=16,
                                          stream=True))
    assert [e.item.status for e in events if e.type == "response.output_item.done"] == ["incomplete"]
    assert events[-1].type == "response.incomplete" and events[-1].response.output[0].status == "incomplete"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_cut_by_max_tokens_is_an_incomplete_call(client, model, choice):
    r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice=choice,
                                       max_tokens=40, temperature=1.0, seed=1, reasoning_effort="none")
    c = r.choices[0]
    assert c.finish_reason == "length" and c.message.content is None
    [call] = c.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments.startswith('{"city": "')
    chunks = list(client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice=choice,
                                                 max_tokens=40, temperature=1.0, seed=1, reasoning_effort="none",
                                                 stream=True))
    streamed = [d.function for ch in chunks for d in (ch.choices[0].delta.tool_calls or []) if ch.choices]
    assert streamed[0].name == "get_weather" and "".join(f.arguments or "" for f in streamed) == call.function.arguments
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["length"]


def test_a_forced_call_cut_by_max_tokens_is_an_incomplete_call_on_responses_and_anthropic(base_url, client, model):
    f = WEATHER["function"]
    resp = dict(model=model, input="Weather in Paris?", tools=[{"type": "function", **f}], tool_choice="required",
                max_output_tokens=40, temperature=1.0, reasoning={"effort": "none"})
    r = client.responses.create(**resp)
    (item,) = r.output
    assert r.status == "incomplete" and (item.type, item.status, item.name) == ("function_call", "incomplete",
                                                                                 "get_weather")
    assert item.arguments.startswith('{"city": "')
    events = list(client.responses.create(**resp, stream=True))
    assert [e.item.status for e in events if e.type == "response.output_item.done"] == ["incomplete"]
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta").startswith(
        '{"city": "') and events[-1].type == "response.incomplete"
    messages = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0, timeout=120).messages
    anth = dict(model=model, messages=ASK, max_tokens=40, tools=[{"name": f["name"], "input_schema": f["parameters"]}],
                tool_choice={"type": "any"}, thinking={"type": "disabled"})
    m = messages.create(**anth)
    assert m.stop_reason == "max_tokens" and [(b.type, b.name, b.input) for b in m.content] == \
        [("tool_use", "get_weather", {})]  # its one string value was cut: no member is whole
    with messages.stream(**anth) as stream:
        events = list(stream)
        final = stream.get_final_message()
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta"
                      and e.delta.type == "input_json_delta")
    assert partial.startswith('{"city": "') and final.stop_reason == "max_tokens"
    assert [(b.type, b.name) for b in final.content] == [("tool_use", "get_weather")]


def test_every_error_response_has_a_log_line(base_url, home, client, model):
    assert httpx.get(base_url + "/no/such/route").status_code == 404
    assert httpx.post(base_url + "/v1/chat/completions", json={"model": model, "messages": "x"}).status_code == 400
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=ASK)
    lines = [json.loads(line) for line in server_log(home).splitlines() if line.startswith("{")]
    errors = [(e["route"], e["status"], e["reason"]) for e in lines if e.get("msg") == "error response"]
    assert ("/no/such/route", 404, "Not Found") in errors
    assert any(route == "/v1/chat/completions" and status == 400 and "messages" in reason
               for route, status, reason in errors)
    assert any(status == 404 and "no-such-model" in reason for _, status, reason in errors)


def test_error_answers_outside_the_handlers_have_a_log_line_too(base_url, home, model):
    """Routes that answer an error themselves: a blob's HEAD, a missing web UI file, a cut upload;
    and the Anthropic and Ollama routes' own errors."""
    absent = "/api/blobs/sha256:" + "cd" * 32
    assert httpx.head(base_url + absent).status_code == 404
    assert httpx.get(base_url + "/ui/no-such-file.js").status_code == 404
    assert httpx.post(base_url + "/v1/messages", json={"model": model, "max_tokens": 4}).status_code == 400
    assert httpx.post(base_url + "/api/chat", json={"model": "no-such-model", "messages": ASK}).status_code == 404
    lines = [json.loads(line) for line in server_log(home).splitlines() if line.startswith("{")]
    errors = [(e["route"], e["status"], e["reason"]) for e in lines if e.get("msg") == "error response"]
    assert (absent, 404, "no such blob") in errors
    assert any(route == "/ui/no-such-file.js" and status == 404 for route, status, _ in errors)
    assert any(route == "/v1/messages" and status == 400 and "messages" in reason for route, status, reason in errors)
    assert any(route == "/api/chat" and status == 404 and "no-such-model" in reason for route, status, reason in errors)
