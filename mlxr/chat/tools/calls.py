"""A parsed tool call, and reading calls out of JSON the way the families write them."""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import jiter

MAX_CALLS = 64  # calls taken from one reply; the rest stays content


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=new_call_id)
    cut: str | None = None  # a call that max_tokens cut off: its arguments' text as far as written

    def cut_off(self, text: str) -> ToolCall:
        """This call as max_tokens cut it: its arguments' text as far as written, and as an
        object the members that text holds whole (what Anthropic's client makes of the streamed
        partial JSON), so a cut call's `input` is the same streamed or not."""
        self.cut = text
        try:
            value = jiter.from_json(text.encode(), partial_mode=True) if text.strip() else {}
        except ValueError:
            value = {}
        self.arguments = value if isinstance(value, dict) else {}
        return self

    @property
    def arguments_json(self) -> str:
        """OpenAI's `arguments`: the object as JSON text (a cut call's partial text)."""
        return self.cut if self.cut is not None else json.dumps(self.arguments, ensure_ascii=False)


def call_from_object(obj: Any) -> ToolCall | None:
    """{"name": ..., "arguments"|"parameters": {...} or its JSON text} -> a call, else None."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # OpenAI's own shape, which some models echo
        obj = obj["function"]
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        return None
    return ToolCall(name, args)


def calls_from_json(text: str) -> list[ToolCall] | None:
    """One call object or a list of them; None unless all of it parses into calls."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [call_from_object(item) for item in items[:MAX_CALLS]]
    if not calls or len(items) > MAX_CALLS or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def calls_from_json_prefix(text: str) -> tuple[list[ToolCall], str] | None:
    """Calls from JSON at the start of `text` (one value), and the text after it."""
    stripped = text.lstrip()
    try:
        value, end = json.JSONDecoder().raw_decode(stripped)
    except ValueError:
        return None
    calls = calls_from_json(json.dumps(value))
    return (calls, stripped[end:]) if calls else None


_CUT_NAME = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")')


def cut_calls(text: str, args_key: str = "arguments") -> list[ToolCall]:
    """The calls of a forced reply that max_tokens cut off: those written whole, then the cut one
    (its name, the text of its arguments so far) if its name was written; [] if none was."""
    whole, rest = _whole_items(text)
    m = _CUT_NAME.match(rest)
    if m is None:
        return whole
    after = rest[m.end():]
    key = re.match(r'\s*,\s*"' + re.escape(args_key) + r'"\s*:\s*', after)
    return [*whole, ToolCall(json.loads(m.group(1)), {}).cut_off(after[key.end():] if key else "")]


def _whole_items(text: str) -> tuple[list[ToolCall], str]:
    """The calls a cut list holds whole, and the text of the one after them."""
    rest = text.lstrip()
    if not rest.startswith("["):
        return [], rest
    found, rest, decoder = [], rest[1:].lstrip(), json.JSONDecoder()
    while len(found) < MAX_CALLS:
        try:
            value, end = decoder.raw_decode(rest)
        except ValueError:
            break
        call = call_from_object(value)
        if call is None:
            break
        found.append(call)
        rest = rest[end:].lstrip().removeprefix(",").lstrip()
    return found, rest
