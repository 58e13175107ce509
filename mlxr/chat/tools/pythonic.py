"""Llama 4 (and Llama 3.2's pythonic template): the whole reply is a Python list of calls,
`[get_weather(city="Paris"), add(a=1, b=2)]`, keyword arguments holding literals. Read with
`ast` (parsed, never run); a call streams once its closing parenthesis is written."""
from __future__ import annotations

import ast
import json
from typing import Any

from mlxr.chat.tools.calls import MAX_CALLS, ToolCall
from mlxr.chat.tools.formats import ToolFormat, Tools, register
from mlxr.chat.tools.json_stream import Partial

MAX_TEXT = 1 << 20  # characters of a reply read as calls
MAX_TRIES = 8  # closing parentheses tried, from the last, to find the calls written whole so far


def _call(node: ast.AST) -> ToolCall | None:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            return None
        args[kw.arg] = ast.literal_eval(kw.value)
    json.dumps(args)  # a literal JSON cannot hold (a set, bytes) is not arguments
    return ToolCall(node.func.id, args)


def calls_from_python(text: str) -> list[ToolCall] | None:
    text = text.strip()
    if not text.startswith("[") or len(text) > MAX_TEXT:
        return None
    try:
        tree = ast.parse(text, mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts or len(tree.elts) > MAX_CALLS:
            return None
        calls = [_call(e) for e in tree.elts]
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None
    return calls if all(calls) else None  # type: ignore[return-value]


def _complete_prefix(text: str) -> list[ToolCall]:
    """The calls a list still being written holds whole: the text cut after each `)` tried."""
    text = text.strip()
    ends = [i for i in range(len(text) - 1, 0, -1) if text[i] == ")"][:MAX_TRIES]
    for i in ends:
        calls = calls_from_python(text[:i + 1] + "]")
        if calls is not None:
            return calls
    return []


def parse(body: str, tools: Tools) -> list[ToolCall] | None:
    return calls_from_python("[" + body)  # the start marker is the list's bracket


def partial(body: str, tools: Tools) -> list[Partial]:
    return [Partial(c.name, c.arguments_json) for c in _complete_prefix("[" + body)]


PYTHONIC = register(ToolFormat(
    name="pythonic", starts=("[",), end=None, parse=parse, partial=partial, opens_reply=True,
    detect=lambda template: "[func_name1(" in template,
))
