"""Every tool-call format through a real server and the official openai client: one server
serving a random-weight tiny Llama once per format, each copy given a template that chooses
its format; the model is made to write a recorded reply exactly (a regex of its text, vLLM's
`structured_outputs` extra). The unstreamed reply gives the recorded calls and content, and the
streamed `tool_calls` fragments concatenate to the same arguments, call by call."""
from __future__ import annotations

import json
import shutil

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
def client(tmp_path_factory):
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
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def literal(text: str) -> str:
    """text as a regex that matches only it (the grammar engine's regex syntax)."""
    return "".join("\\n" if ch == "\n" else "\\" + ch if ch in "\\.+*?()|[]{}^$#&-~" else ch for ch in text)


@pytest.mark.parametrize("fmt,reply,content,calls", REPLIES, ids=[f"{r[0]}-{i}" for i, r in enumerate(REPLIES)])
def test_each_format_through_the_server_streamed_or_not(client, fmt, reply, content, calls):
    name = next(m.id for m in client.models.list().data if m.id.split(":")[0] == model_name(fmt))
    args = dict(model=name, messages=[{"role": "user", "content": "go"}], tools=OPENAI_TOOLS, temperature=0.0,
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
