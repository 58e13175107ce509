"""The server the real-client tests talk to: a random-weight tiny Llama given a Llama-3 style
tool template, so that a reply which is a JSON call (`{"name": ..., "parameters": ...}`) is read
as a tool call on every API. A random model calls no tool of its own: the tests make it write a
call with structured output (a JSON schema of the call) or with a forced tool_choice, and what
they check is everything around it: the client's request, the call it reads, the tool it runs,
the tool result sent back and the answer after it."""
from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

from model_fixtures import fixture_model
from server_harness import running_server

MODEL = "tiny-tools:latest"
LLAMA_TOOL_TEMPLATE = (  # our own, in the Llama 3 family's shape: detected as llama3_json
    "{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nTools: {{ tools | tojson }}<|eot_id|>{% endif %}"
    "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def call_schema(name: str, parameters: dict) -> dict:
    """A JSON schema whose every instance is a call of `name` in the llama3_json format."""
    return {"type": "object", "properties": {"name": {"const": name}, "parameters": parameters},
            "required": ["name", "parameters"], "additionalProperties": False}


@contextlib.contextmanager
def tool_template_server(tmp: Path, *extra_args: str, api_key: str | None = None) -> Iterator[str]:
    model_dir = tmp / "tiny-tools"
    shutil.copytree(fixture_model("tiny-llama3").hf_dir, model_dir)
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": LLAMA_TOOL_TEMPLATE}))
    with running_server(tmp / "home", "--model", str(model_dir), "--max-model-len", "1024", *extra_args,
                        api_key=api_key) as url:
        yield url
