"""DeepSeek V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{JSON}
<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>` (the markers use U+FF5C and U+2581)."""
from __future__ import annotations

import json

from mlxr.chat.tools.calls import MAX_CALLS, ToolCall
from mlxr.chat.tools.formats import ToolFormat, Tools, register
from mlxr.chat.tools.json_stream import Partial, json_args_prefix

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_BEGIN, _SEP, _END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"


def _heads(body: str) -> list[tuple[str, str]]:
    """(name, the arguments' text) per call whose name is complete."""
    out = []
    for segment in body.split(_BEGIN)[1:MAX_CALLS + 1]:
        if _SEP not in segment:
            break
        name, args = segment.split(_SEP, 1)
        out.append((name.strip(), args))
    return out


def parse(body: str, tools: Tools) -> list[ToolCall] | None:
    heads = _heads(body)
    if not heads or len(heads) != body.count(_BEGIN):
        return None
    calls = []
    for name, args in heads:
        if _END not in args or not name:
            return None
        try:
            value = json.loads(args.split(_END, 1)[0])
        except ValueError:
            return None
        if not isinstance(value, dict):
            return None
        calls.append(ToolCall(name, value))
    return calls


def partial(body: str, tools: Tools) -> list[Partial]:
    return [Partial(name, json_args_prefix(args.split(_END, 1)[0])) for name, args in _heads(body) if name]


DEEPSEEK31 = register(ToolFormat(
    name="deepseek_v31", starts=(CALLS_BEGIN,), end=CALLS_END, parse=parse, partial=partial, string_arguments=True,
    detect=lambda template: CALLS_BEGIN in template and _SEP in template,
))
