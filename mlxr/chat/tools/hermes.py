"""Hermes / Qwen 2.5 / Qwen 3: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`."""
from mlxr.chat.tools.formats import ToolFormat, register

HERMES = register(ToolFormat(
    name="hermes", starts=("<tool_call>",), end="</tool_call>",
    detect=lambda template: "<tool_call>" in template and "tools" in template,
))
