"""gpt-oss's harmony format as a tool format: its template renders the tools (a TypeScript-like
`namespace functions`) and past calls and results itself. Its replies are not read by the call
splitter but by chat/harmony.py's HarmonySplitter, which also takes the reasoning channel."""
from mlxr.chat.tools.formats import ToolFormat, register


def template_is_harmony(source: str | None) -> bool:
    """Whether a chat template renders harmony (gpt-oss's): it writes channels and <|call|>."""
    return bool(source) and "<|channel|>" in source and "<|call|>" in source  # type: ignore[operator]


HARMONY = register(ToolFormat(name="harmony", starts=("to=functions.",), end="<|call|>", detect=template_is_harmony))
