"""Calls read out of JSON text while it is still being written: each call's name once its
string is complete, and its arguments as the longest prefix of their final canonical text
(`json.dumps(arguments, ensure_ascii=False)`) that no later text can change. A string is
given as far as its escapes are complete, a number or literal once a token follows it; the
separators are re-written in the canonical form, so the streamed prefixes concatenated equal
the arguments text of the parsed call."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

_TOKEN = re.compile(r'\s+|"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[{}\[\]:,]|[^\s{}\[\]:,"]+')
_TAIL_ESCAPE = re.compile(r'\\(?:u[0-9a-fA-F]{0,3})?$|\\u[dD][89abAB][0-9a-fA-F]{2}(?:\\u?[0-9a-fA-F]{0,3})?$')


@dataclass
class Partial:
    """A call as far as it is known: its name ("" until complete) and its arguments' text."""
    name: str = ""
    args: str = ""
    id: str = ""  # the call's id where the format writes one (Kimi K2's functions.name:0)


def held_suffix(text: str, markers: tuple[str, ...]) -> int:
    """How many trailing characters of text could begin one of the markers."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


def string_prefix(raw: str) -> str:
    """The canonical text of a string token that is not closed yet (`raw` after its quote)."""
    raw = _TAIL_ESCAPE.sub("", raw)
    try:
        return json.dumps(json.loads('"' + raw + '"'), ensure_ascii=False)[:-1]
    except ValueError:
        return '"'


def canonical(token: str) -> str | None:
    """A complete scalar token in canonical form (None: not JSON)."""
    try:
        return json.dumps(json.loads(token), ensure_ascii=False)
    except ValueError:
        return None


class _Scan:
    """One pass over the text: containers open, the call objects found, the arguments captured."""

    def __init__(self, args_keys: tuple[str, ...], final: bool = False) -> None:
        self.args_keys, self.final = args_keys, final
        self.stack: list[str] = []  # "{" / "[" per open container
        self.calls: list[Partial] = []
        self.key: str | None = None  # the last key read in the current call object
        self.expect_key = False
        self.capture_depth: int | None = None  # depth of the arguments object being captured
        self.pending = ""  # a separator held until the next token shows the object goes on

    def call_depth(self) -> int:
        return 2 if self.stack[:1] == ["["] else 1

    def run(self, text: str) -> list[Partial]:
        tokens = [m.group(0) for m in _TOKEN.finditer(text)]
        for i, tok in enumerate(tokens):
            last = i == len(tokens) - 1
            if tok[0].isspace():
                continue
            if not self.step(tok, last):
                break
        return self.calls

    def step(self, tok: str, last: bool) -> bool:
        closed_string = tok[0] == '"' and len(tok) > 1 and tok.endswith('"') and not _odd_backslashes(tok[1:-1])
        if tok[0] == '"' and not closed_string:  # a string still being written
            if self.capture_depth is not None and last:
                self.emit(string_prefix(tok[1:]))
            return False
        if tok[0] not in '{}[]:,"' and last and not self.final:
            return False  # a number or literal that may go on
        if self.capture_depth is not None:
            return self.captured(tok)
        return self.outside(tok)

    def emit(self, text: str) -> None:
        self.calls[-1].args += self.pending + text
        self.pending = ""

    def captured(self, tok: str) -> bool:
        if tok in "{[":
            self.emit(tok)
            self.stack.append(tok)
        elif tok in "}]":
            self.pending = ""  # a trailing comma is not JSON; json.loads refuses it later
            self.calls[-1].args += tok
            self.stack.pop()
            if len(self.stack) < self.capture_depth:  # type: ignore[operator]
                self.capture_depth = None
        elif tok == ",":
            self.pending = ", "
        elif tok == ":":
            self.emit(": ")
        else:
            value = canonical(tok)
            if value is None:
                return False
            self.emit(value)
        return True

    def outside(self, tok: str) -> bool:
        depth = len(self.stack)
        if tok in "{[":
            if tok == "{" and depth + 1 == self.call_depth():
                self.calls.append(Partial())
                self.key, self.expect_key = None, True
            elif tok == "{" and depth == self.call_depth() and self.key in self.args_keys and self.calls:
                self.calls[-1].args = "{"
                self.capture_depth = depth + 1
            self.stack.append(tok)
        elif tok in "}]":
            if not self.stack:
                return False
            self.stack.pop()
            return bool(self.stack)  # the top-level value is whole: what follows is not its
        elif tok == ",":
            self.expect_key = depth == self.call_depth()
        elif tok == ":":
            self.expect_key = False
        elif not self.stack or (tok[0] != '"' and canonical(tok) is None):
            return False  # not JSON
        elif depth == self.call_depth() and tok[0] == '"':
            value = json.loads(tok)
            if self.expect_key:
                self.key = value
            elif self.key == "name" and isinstance(value, str) and self.calls:
                self.calls[-1].name = value
        return True


def _odd_backslashes(body: str) -> bool:
    return (len(body) - len(body.rstrip("\\"))) % 2 == 1


def partial_json_calls(text: str, args_keys: tuple[str, ...] = ("arguments", "parameters"),
                       final: bool = False) -> list[Partial]:
    """The calls visible so far in JSON text holding one call object or a list of them (final:
    the text ends here, so a number or literal at its end is as written)."""
    stripped = text.lstrip()
    if not stripped or stripped[0] not in "[{":
        return []
    return _Scan(args_keys, final).run(stripped)


def json_args_prefix(text: str) -> str:
    """The canonical prefix of one arguments object still being written ("" until it opens)."""
    found = _Scan(("arguments",)).run('{"name": "_", "arguments": ' + text.lstrip())
    return found[0].args if found else ""
