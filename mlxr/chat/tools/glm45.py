"""GLM-4.5 / 4.6 / 4.7: `<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n...
</tool_call>`. The template writes a string value as it is and any other as JSON, so a value
is read by its parameter's type (JSON where it parses when the type is not declared)."""
from __future__ import annotations

import re

from mlxr.chat.tools.calls import ToolCall
from mlxr.chat.tools.formats import ToolFormat, Tools, register
from mlxr.chat.tools.json_stream import Partial, held_suffix
from mlxr.chat.tools.values import is_string, pairs_prefix, param_type, typed_value

_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)
_OPEN_VALUE = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*)\Z", re.S)
_FIRST = "<arg_key>"


def _name(body: str) -> tuple[str, str] | None:
    """(the call's name, the text after it) once the name is followed by its first pair or the end."""
    i = body.find(_FIRST)
    name = (body if i < 0 else body[:i]).strip()
    return (name, body[i:] if i >= 0 else "") if name and "<" not in name else None


def _pairs(rest: str, name: str, tools: Tools) -> tuple[list, int]:
    done, pos = [], 0
    for m in _PAIR.finditer(rest):
        if rest[pos:m.start()].strip():
            break
        key = m.group(1).strip()
        done.append((key, typed_value(m.group(2), param_type(tools, name, key))))
        pos = m.end()
    return done, pos


def parse(body: str, tools: Tools) -> list[ToolCall] | None:
    found = _name(body)
    if found is None:
        return None
    name, rest = found
    done, pos = _pairs(rest, name, tools)
    return [ToolCall(name, dict(done))] if not rest[pos:].strip() else None


def partial(body: str, tools: Tools) -> list[Partial]:
    i = body.find(_FIRST)
    if i < 0:
        return []  # the name may go on
    name, rest = body[:i].strip(), body[i:]
    done, pos = _pairs(rest, name, tools)
    m = _OPEN_VALUE.match(rest[pos:].lstrip())
    if m is None:
        return [Partial(name, pairs_prefix(done))]
    key = m.group(1).strip()
    if not is_string(param_type(tools, name, key)):
        return [Partial(name, pairs_prefix(done))]
    raw = m.group(2)
    return [Partial(name, pairs_prefix(done, key, raw[:len(raw) - held_suffix(raw, ("</arg_value>",))]))]


GLM45 = register(ToolFormat(
    name="glm45", starts=("<tool_call>",), end="</tool_call>", parse=parse, partial=partial,
    detect=lambda template: "<arg_key>" in template and "<arg_value>" in template,
))
