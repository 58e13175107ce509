"""Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:INDEX
<|tool_call_argument_begin|>{JSON}<|tool_call_end|>...<|tool_calls_section_end|>`. The
`functions.NAME:INDEX` text is the call's id (the template writes it back in later turns)."""
from __future__ import annotations

import json
import re

from mlxr.chat.tools.calls import MAX_CALLS, ToolCall
from mlxr.chat.tools.formats import ToolFormat, Tools, register
from mlxr.chat.tools.json_stream import Partial, json_args_prefix

_BEGIN, _ARGS, _END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_ID = re.compile(r"(?:functions\.)?(.+?)(?::\d+)?")


def _segments(body: str) -> list[str]:
    return body.split(_BEGIN)[1:MAX_CALLS + 1]


def _head(segment: str) -> tuple[str, str, str] | None:
    """(id, name, the arguments' text) once the id is complete."""
    if _ARGS not in segment:
        return None
    call_id, args = segment.split(_ARGS, 1)
    call_id = call_id.strip()
    m = _ID.fullmatch(call_id)
    return (call_id, m.group(1), args) if m and call_id else None


def parse(body: str, tools: Tools) -> list[ToolCall] | None:
    calls = []
    for segment in _segments(body):
        head = _head(segment)
        if head is None or _END not in head[2]:
            return None
        call_id, name, args = head
        try:
            value = json.loads(args.split(_END, 1)[0])
        except ValueError:
            return None
        if not isinstance(value, dict):
            return None
        calls.append(ToolCall(name, value, id=call_id))
    return calls or None


def partial(body: str, tools: Tools) -> list[Partial]:
    out = []
    for segment in _segments(body):
        head = _head(segment)
        if head is None:
            break
        call_id, name, args = head
        out.append(Partial(name, json_args_prefix(args.split(_END, 1)[0]), id=call_id))
    return out


KIMI_K2 = register(ToolFormat(
    name="kimi_k2", starts=("<|tool_calls_section_begin|>",), end="<|tool_calls_section_end|>",
    parse=parse, partial=partial,
    detect=lambda template: "<|tool_calls_section_begin|>" in template,
))
