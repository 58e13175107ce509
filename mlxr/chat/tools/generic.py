"""The format for templates that render no tools (the built-in Gemma and ChatML templates,
SmolLM2's): the tools are described in the system prompt and a call is
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (a JSON list inside the tags, as
SmolLM2 was trained to write, is read too)."""
from __future__ import annotations

import json
from typing import Any

from mlxr.chat.tools.formats import ToolFormat, register

GENERIC = register(ToolFormat(
    name="generic", starts=("<tool_call>",), end="</tool_call>", renders_tools=False,
    detect=lambda template: False,
))

_INSTRUCTIONS = (  # short: small models have small contexts
    "Tools:\n<tools>\n{tools}\n</tools>\n"
    'To call one, reply <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>'
)


def tools_prompt(tools: list[dict[str, Any]]) -> str:
    lines = [json.dumps(t.get("function", t), ensure_ascii=False) for t in tools]
    return _INSTRUCTIONS.format(tools="\n".join(lines))


def call_text(name: str, arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"


def response_text(content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>"
