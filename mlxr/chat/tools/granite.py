"""Granite 3.x: `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]` to the end of the reply
(`<|tool_call|>` is a special token, so the text may start at the list)."""
from mlxr.chat.tools.formats import ToolFormat, register

GRANITE = register(ToolFormat(
    name="granite", starts=("<|tool_call|>",), end=None, bare_json=True,
    detect=lambda template: "<|tool_call|>" in template and "<|start_of_role|>" in template,
))
