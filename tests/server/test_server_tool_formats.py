"""Every tool-call format through a real server and the official clients, on all four APIs: one
server serving a random-weight tiny Llama once per format, each copy given a template that
chooses its format; the model is made to write a recorded reply exactly (a regex of its text,
vLLM's `structured_outputs` extra, which every route takes). The unstreamed reply gives the
recorded calls and content, and the streamed argument fragments (Chat Completions'
`tool_calls`, Responses' `function_call_arguments.delta`, Anthropic's `input_json_delta`,
Ollama's whole-call chunks) concatenate to the same arguments, call by call."""
from __future__ import annotations

import json
import shutil

import anthropic
import httpx
import ollama
import openai
import pytest
from model_fixtures import fixture_model
from server_harness import running_server
from tool_replies import REPLIES, TEMPLATES, TOOLS

BASE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if tools %}tools: {% for t in tools %}{{ t.function.name }} {% endfor %}{% endif %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
OPENAI_TOOLS = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in TOOLS.items()]


def model_name(fmt: str) -> str:
    return fmt.replace("_", "-")


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("formats")
    args = []
    for fmt in sorted({r[0] for r in REPLIES}):
        model_dir = root / model_name(fmt)
        shutil.copytree(fixture_model("tiny-llama3").hf_dir, model_dir)
        config_path = model_dir / "tokenizer_config.json"
        template = "{#- " + TEMPLATES[fmt] + " -#}" + BASE  # the markers where detection reads them
        config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "chat_template": template}))
        args += ["--model", str(model_dir)]
    with running_server(tmp_path_factory.mktemp("home"), *args, "--max-model-len", "1024") as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def served_name(client, fmt: str) -> str:
    return next(m.id for m in client.models.list().data if m.id.split(":")[0] == model_name(fmt))


def literal(text: str) -> str:
    """text as a regex that matches only it (the grammar engine's regex syntax)."""
    return "".join("\\n" if ch == "\n" else "\\" + ch if ch in "\\.+*?()|[]{}^$#&-~" else ch for ch in text)


@pytest.mark.parametrize("fmt,reply,content,calls", REPLIES, ids=[f"{r[0]}-{i}" for i, r in enumerate(REPLIES)])
def test_each_format_through_the_server_streamed_or_not(client, fmt, reply, content, calls):
    args = dict(model=served_name(client, fmt), messages=[{"role": "user", "content": "go"}], tools=OPENAI_TOOLS, temperature=0.0,
                max_tokens=400, extra_body={"structured_outputs": {"regex": literal(reply)}})
    whole = client.chat.completions.create(**args).choices[0]
    assert (whole.message.content or "") == content
    got = [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls or []]
    assert got == calls and whole.finish_reason == "tool_calls"
    streamed: dict[int, dict] = {}
    text = ""
    for chunk in client.chat.completions.create(**args, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                call = streamed.setdefault(d.index, {"name": "", "arguments": ""})
                call["name"] += (d.function.name or "") if d.function else ""
                call["arguments"] += (d.function.arguments or "") if d.function else ""
    assert text == content
    assert [(c["name"], c["arguments"]) for c in streamed.values()] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]


@pytest.mark.parametrize("fmt,reply,content,calls", REPLIES, ids=[f"{r[0]}-{i}" for i, r in enumerate(REPLIES)])
def test_each_format_on_the_responses_api_streamed_or_not(client, fmt, reply, content, calls):
    args = dict(model=served_name(client, fmt), input="go", temperature=0.0, max_output_tokens=400,
                tools=[{"type": "function", "name": n, "parameters": p} for n, p in TOOLS.items()],
                extra_body={"structured_outputs": {"regex": literal(reply)}})
    whole = client.responses.create(**args)
    items = [o for o in whole.output if o.type == "function_call"]
    assert [(o.name, json.loads(o.arguments)) for o in items] == calls and whole.status == "completed"
    assert whole.output_text == content
    events = list(client.responses.create(**args, stream=True))
    added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    deltas = {item.id: "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta"
                               and e.item_id == item.id) for item in added}
    done = {e.item_id: e.arguments for e in events if e.type == "response.function_call_arguments.done"}
    assert [(i.name, deltas[i.id]) for i in added] == [(i.name, done[i.id]) for i in added] == \
        [(o.name, o.arguments) for o in items]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == content and events[-1].type == "response.completed"


@pytest.mark.parametrize("fmt,reply,content,calls", REPLIES, ids=[f"{r[0]}-{i}" for i, r in enumerate(REPLIES)])
def test_each_format_on_the_anthropic_api_streamed_or_not(base_url, client, fmt, reply, content, calls):
    messages = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120).messages
    args = dict(model=served_name(client, fmt), messages=[{"role": "user", "content": "go"}], max_tokens=400,
                tools=[{"name": n, "input_schema": p} for n, p in TOOLS.items()],
                extra_body={"temperature": 0.0, "structured_outputs": {"regex": literal(reply)}})
    whole = messages.create(**args)
    uses = [b for b in whole.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in uses] == calls and whole.stop_reason == "tool_use"
    assert "".join(b.text for b in whole.content if b.type == "text") == content
    with messages.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = {e.index: e.content_block.name for e in events
              if e.type == "content_block_start" and e.content_block.type == "tool_use"}
    parts = {i: "".join(e.delta.partial_json for e in events if e.type == "content_block_delta"
                        and e.index == i and e.delta.type == "input_json_delta") for i in starts}
    assert [(starts[i], json.loads(parts[i])) for i in starts] == [(b.name, b.input) for b in uses]
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == calls
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta") \
        == content and final.stop_reason == "tool_use"


class ExtraBody(httpx.HTTPTransport):
    """Adds fields to each JSON body the ollama client sends (it has no extra-body option)."""

    def __init__(self, extra: dict) -> None:
        super().__init__()
        self.extra = extra

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = {**json.loads(request.content), **self.extra}
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        return super().handle_request(httpx.Request(request.method, request.url, headers=headers, json=body))


@pytest.mark.parametrize("fmt,reply,content,calls", REPLIES, ids=[f"{r[0]}-{i}" for i, r in enumerate(REPLIES)])
def test_each_format_on_the_ollama_api_streamed_or_not(base_url, client, fmt, reply, content, calls):
    chat = ollama.Client(host=base_url, timeout=120,
                         transport=ExtraBody({"structured_outputs": {"regex": literal(reply)}})).chat
    args = dict(model=served_name(client, fmt), messages=[{"role": "user", "content": "go"}], tools=OPENAI_TOOLS,
                options={"temperature": 0, "num_predict": 400})
    whole = chat(**args)
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []] == calls
    assert whole.message.content == content
    chunks = list(chat(**args, stream=True))
    streamed = [(c.function.name, c.function.arguments) for chunk in chunks for c in chunk.message.tool_calls or []]
    assert streamed == calls and not chunks[-1].message.tool_calls  # each call before the final object
    assert "".join(c.message.content for c in chunks) == content and chunks[-1].done


def test_structured_outputs_beside_another_constraint_is_a_400_naming_it(base_url, client):
    name = served_name(client, "hermes")
    regex = {"structured_outputs": {"regex": "a+"}}
    schema = {"type": "object"}
    for path, body in (("/v1/responses", {"input": "go", "text": {"format": {"type": "json_schema", "name": "x",
                                                                          "schema": schema}}}),
                       ("/v1/messages", {"messages": [{"role": "user", "content": "go"}], "max_tokens": 8,
                                         "tools": [{"name": "add", "input_schema": schema}],
                                         "tool_choice": {"type": "any"}}),
                       ("/api/chat", {"messages": [{"role": "user", "content": "go"}], "format": "json"}),
                       ("/api/generate", {"prompt": "go", "format": schema})):
        r = httpx.post(base_url + path, json={"model": name, **body, **regex}, timeout=60)
        assert r.status_code == 400, (path, r.text)
        assert "structured_outputs" in r.text or "tool_choice" in r.text, (path, r.text)
    r = httpx.post(base_url + "/api/generate", json={"model": name, "prompt": "go", "stream": False,
                                                     "structured_outputs": {"choice": ["yes", "no"]}}, timeout=60)
    assert r.status_code == 200 and r.json()["response"] in ("yes", "no"), r.text


# (format, a reply's start that max_tokens cuts inside a call's third value, the members written whole)
CUTS = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "unit": "',
     {"city": "Paris", "days": 3}),
    ("qwen3_xml", "On it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                  "<parameter=days>\n3\n</parameter>\n<parameter=unit>\n", {"city": "Paris", "days": 3}),
]
CUT_AT = 96  # tokens: past each start above, inside the letters after it


@pytest.mark.parametrize("fmt,start,whole", CUTS, ids=[c[0] for c in CUTS])
def test_a_call_cut_by_max_tokens_is_the_same_cut_call_streamed_or_not_on_every_api(base_url, client, fmt, start,
                                                                                   whole):
    name, regex = served_name(client, fmt), {"structured_outputs": {"regex": literal(start) + "[a-z]{4000}"}}
    ask = [{"role": "user", "content": "go"}]
    chat = dict(model=name, messages=ask, tools=OPENAI_TOOLS, temperature=0.0, max_tokens=CUT_AT, extra_body=regex)
    c = client.chat.completions.create(**chat).choices[0]
    (call,) = c.message.tool_calls
    assert c.finish_reason == "length" and call.function.arguments.startswith('{"city": "Paris", "days": 3, "unit": "')
    parts = [d.function.arguments or "" for ch in client.chat.completions.create(**chat, stream=True)
             for d in (ch.choices[0].delta.tool_calls or []) if ch.choices]
    assert "".join(parts) == call.function.arguments

    resp = dict(model=name, input="go", temperature=0.0, max_output_tokens=CUT_AT, extra_body=regex,
                tools=[{"type": "function", "name": n, "parameters": p} for n, p in TOOLS.items()])
    r = client.responses.create(**resp)
    (item,) = [o for o in r.output if o.type == "function_call"]
    assert r.status == "incomplete" and item.status == "incomplete" and item.arguments == call.function.arguments
    events = list(client.responses.create(**resp, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == item.arguments
    assert [e.item.status for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"] \
        == ["incomplete"]

    messages = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120).messages
    anth = dict(model=name, messages=ask, max_tokens=CUT_AT, tools=[{"name": n, "input_schema": p} for n, p in TOOLS.items()],
                extra_body={"temperature": 0.0, **regex})
    m = messages.create(**anth)
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "max_tokens" and (use.name, use.input) == ("get_weather", whole)
    with messages.stream(**anth) as stream:
        events = list(stream)
        final = stream.get_final_message()
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta"
                      and e.delta.type == "input_json_delta")
    assert partial == call.function.arguments and final.stop_reason == "max_tokens"
    assert [b.input for b in final.content if b.type == "tool_use"] == [whole]

    ollama_chat = ollama.Client(host=base_url, timeout=120, transport=ExtraBody(regex)).chat
    args = dict(model=name, messages=ask, tools=OPENAI_TOOLS, options={"temperature": 0, "num_predict": CUT_AT})
    o = ollama_chat(**args)
    assert o.done_reason == "length" and [(t.function.name, t.function.arguments) for t in o.message.tool_calls] == \
        [("get_weather", whole)]
    chunks = list(ollama_chat(**args, stream=True))
    assert [(t.function.name, t.function.arguments) for ch in chunks for t in ch.message.tool_calls or []] == \
        [("get_weather", whole)] and chunks[-1].done_reason == "length"
