"""Qwen3-Coder and Qwen3.5: XML calls,
`<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
A value is text (one newline each side is the template's, not the value's), read by its
parameter's type: text for a string, JSON where it parses for the others."""
from __future__ import annotations

import re

from mlxr.chat.tools.calls import MAX_CALLS, ToolCall
from mlxr.chat.tools.formats import ToolFormat, Tools, register
from mlxr.chat.tools.json_stream import Partial, held_suffix
from mlxr.chat.tools.values import is_string, pairs_prefix, param_type, typed_value

_FUNCTION = re.compile(r"<function=([^>\n]+)>")
_PARAM = re.compile(r"<parameter=([^>\n]+)>")
_PARAM_END, _FUNCTION_END = "</parameter>", "</function>"


def _value(raw: str) -> str:
    return raw.removeprefix("\n").removesuffix("\n")


def _read(body: str, tools: Tools) -> tuple[list[Partial], list[ToolCall], bool]:
    """(the calls as far as written, those complete, whether all of body is well formed)."""
    partials, calls, ok = [], [], True
    for m in list(_FUNCTION.finditer(body))[:MAX_CALLS]:
        name = m.group(1).strip()
        rest = body[m.end():]
        end = rest.find(_FUNCTION_END)
        inner = rest if end < 0 else rest[:end]
        done, open_key, open_text, good = _params(inner, name, tools, end >= 0)
        ok = ok and good
        partials.append(Partial(name, pairs_prefix(done, open_key, open_text, closed=end >= 0 and good)))
        if end >= 0 and good:
            calls.append(ToolCall(name, dict(done)))
    return partials, calls, ok and bool(calls) and len(calls) == len(partials)


def _params(inner: str, name: str, tools: Tools, closed: bool):
    done, pos = [], 0
    for m in _PARAM.finditer(inner):
        if m.start() < pos:
            continue
        key = m.group(1).strip()
        end = inner.find(_PARAM_END, m.end())
        kind = param_type(tools, name, key)
        if end < 0:
            if closed:
                return done, None, None, False
            raw = inner[m.end():]
            raw = raw[:len(raw) - held_suffix(raw, (_PARAM_END,))]
            text = raw.removeprefix("\n") if raw else None
            if text is not None and text.endswith("\n"):
                text = text[:-1]
            return done, (key if is_string(kind) else None), (text if is_string(kind) else None), True
        done.append((key, typed_value(_value(inner[m.end():end]), kind)))
        pos = end + len(_PARAM_END)
    return done, None, None, True


def parse(body: str, tools: Tools) -> list[ToolCall] | None:
    _, calls, ok = _read(body, tools)
    return calls if ok else None


def partial(body: str, tools: Tools) -> list[Partial]:
    return _read(body, tools)[0]


QWEN3_XML = register(ToolFormat(
    name="qwen3_xml", starts=("<tool_call>",), end="</tool_call>", parse=parse, partial=partial,
    detect=lambda template: "<function=" in template and "<parameter=" in template,
))
