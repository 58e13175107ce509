"""FunctionGemma and Gemma 4: `<start_function_call>call:NAME{key:<escape>text<escape>,n:5}
<end_function_call>` (FunctionGemma) and `<|tool_call>call:NAME{key:<|"|>text<|"|>}<tool_call|>`
(Gemma 4). Keys are bare, strings sit between the quote token, numbers, booleans and null are
bare, objects and lists nest. Arguments stream one complete top-level pair at a time."""
from __future__ import annotations

import json
import re
from typing import Any

from mlxr.chat.tools.calls import ToolCall
from mlxr.chat.tools.formats import ToolFormat, Tools, register
from mlxr.chat.tools.json_stream import Partial
from mlxr.chat.tools.values import pairs_prefix

_KEY = re.compile(r"\s*([^\s:{}\[\],]+)\s*:")
_BARE = re.compile(r"[^,}\]]*")
MAX_DEPTH = 32  # nesting read in one value; deeper is not a call


class _Reader:
    def __init__(self, text: str, quote: str) -> None:
        self.text, self.quote, self.pos = text, quote, 0

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def value(self, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError("too deep")
        self.skip()
        t, q = self.text, self.quote
        if t.startswith(q, self.pos):
            end = t.find(q, self.pos + len(q))
            if end < 0:
                raise ValueError("open string")
            s, self.pos = t[self.pos + len(q):end], end + len(q)
            return s
        if t.startswith("{", self.pos):
            return dict(self.pairs(depth + 1))
        if t.startswith("[", self.pos):
            return self.items(depth + 1)
        m = _BARE.match(t, self.pos)
        word = m.group(0).strip() if m else ""
        if not word or m.end() >= len(t):
            raise ValueError("open value")
        self.pos = m.end()
        try:
            return json.loads(word)
        except ValueError:
            return word

    def pairs(self, depth: int, done: list | None = None) -> list[tuple[str, Any]]:
        """At `{`: the pairs to the matching `}` (done: filled as they complete)."""
        return self._separated("}", lambda: self._pair(depth), done if done is not None else [])

    def items(self, depth: int) -> list[Any]:
        return self._separated("]", lambda: self.value(depth), [])

    def _pair(self, depth: int) -> tuple[str, Any]:
        m = _KEY.match(self.text, self.pos)
        if m is None:
            raise ValueError("no key")
        self.pos = m.end()
        return m.group(1), self.value(depth)

    def _separated(self, close: str, read_one, out: list) -> list:
        """After an opening bracket: comma-separated entries up to `close`, appended to out."""
        self.pos += 1
        while True:
            self.skip()
            if self.text.startswith(close, self.pos):
                self.pos += 1
                return out
            if out:
                if not self.text.startswith(",", self.pos):
                    raise ValueError("no comma")
                self.pos += 1
            out.append(read_one())

def _head(body: str) -> tuple[str, str] | None:
    text = body.lstrip()
    if not text.startswith("call:") or "{" not in text:
        return None
    name, rest = text[5:].split("{", 1)
    return (name.strip(), "{" + rest) if name.strip() else None


def _parser(quote: str):
    def parse(body: str, tools: Tools) -> list[ToolCall] | None:
        head = _head(body)
        if head is None:
            return None
        reader = _Reader(head[1], quote)
        try:
            args = dict(reader.pairs(0))
        except (ValueError, RecursionError):
            return None
        return [ToolCall(head[0], args)] if not reader.text[reader.pos:].strip() else None

    def partial(body: str, tools: Tools) -> list[Partial]:
        head = _head(body)
        if head is None:
            return []
        done: list[tuple[str, Any]] = []
        try:
            _Reader(head[1], quote).pairs(0, done)
            return [Partial(head[0], pairs_prefix(done, closed=True))]
        except (ValueError, RecursionError):
            return [Partial(head[0], pairs_prefix(done))]
    return parse, partial


_FG_PARSE, _FG_PARTIAL = _parser("<escape>")
FUNCTION_GEMMA = register(ToolFormat(
    name="functiongemma", starts=("<start_function_call>",), end="<end_function_call>",
    parse=_FG_PARSE, partial=_FG_PARTIAL,
    detect=lambda template: "<start_function_call>" in template,
))
_G4_PARSE, _G4_PARTIAL = _parser('<|"|>')
GEMMA4 = register(ToolFormat(
    name="gemma4", starts=("<|tool_call>",), end="<tool_call|>", parse=_G4_PARSE, partial=_G4_PARTIAL,
    detect=lambda template: "<|tool_call>call:" in template,
))
