"""A format for a template no registered format knows, read from the template itself: the tag
it writes an assistant's calls in (`<TAG>` and its `</TAG>`, or `[TAG]`, just before the call's
JSON), calls in that tag as JSON objects. Only where the template renders tool calls
(`tool_calls` and `tojson`); else None (the generic format applies)."""
from __future__ import annotations

import re

from mlxr.chat.tools.formats import ToolFormat

_TAG = re.compile(r"(<[A-Za-z_|][^<>\s'\"{}]{0,38}>|\[[A-Z_]{3,30}\])")
_WINDOW = 200  # characters between the tag and the call's JSON in the template


def _close(tag: str) -> str:
    return ("</" + tag[1:]) if tag.startswith("<") and not tag.startswith("<|") else (
        tag[:1] + "/" + tag[1:] if tag.startswith("[") else "")


def infer_format(source: str | None) -> ToolFormat | None:
    if not source or "tool_calls" not in source or "tojson" not in source:
        return None
    start = source.find("tool_calls")
    for m in _TAG.finditer(source, start):
        tag = m.group(1)
        near = source[m.end():m.end() + _WINDOW]
        if "tojson" not in near and "arguments" not in near:
            continue
        end = _close(tag)
        return ToolFormat(name="inferred", starts=(tag,), end=end if end and end in source else None,
                          bare_json=False, detect=lambda template: False)
    return None
