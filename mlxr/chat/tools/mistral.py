"""Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` ([TOOL_CALLS] is a special
token, so the text usually starts at the list)."""
from mlxr.chat.tools.formats import ToolFormat, register

MISTRAL = register(ToolFormat(
    name="mistral", starts=("[TOOL_CALLS]",), end=None, bare_json=True,
    detect=lambda template: "[TOOL_CALLS]" in template or "[AVAILABLE_TOOLS]" in template,
))
