"""gpt-oss's harmony reply format, split as it streams into reasoning, content and tool calls.

A reply is a run of messages, each `[<|start|>assistant]` + a header + `<|message|>` + a body +
`<|end|>`, `<|call|>` or `<|return|>`. The header names the channel (`<|channel|>analysis`) and,
for a tool call, the recipient (` to=functions.NAME`, before or after the channel) and maybe the
arguments' type (`<|constrain|>json`). Channels map to the APIs' fields: analysis -> reasoning,
final -> content, commentary addressed to functions.NAME -> a call of NAME whose arguments are
the body's JSON, commentary to nobody (a preamble) -> content. The split does not depend on how
the text was chunked; a call is given whole once its body ends (at <|call|>, or at the end of the
reply: <|call|> is a stop token, whose text the engine drops), and a body that is not a JSON
object (a call cut off by max_tokens) falls back to content. Needs the special tokens kept in the
decoded text (SamplingParams.skip_special_tokens False)."""
from __future__ import annotations

import json
import re

from mlxr.chat.tools.calls import MAX_CALLS, ToolCall
from mlxr.chat.tools.harmony_format import template_is_harmony  # noqa: F401 - this module's test, re-exported
from mlxr.chat.tools.splitter import Piece, held_suffix

START, MESSAGE, CHANNEL = "<|start|>", "<|message|>", "<|channel|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
MAX_HEADER_CHARS = 512  # a longer header is not harmony: the text goes on as content
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=<\||\s|$)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")


class HarmonySplitter:
    def __init__(self) -> None:
        self._buf = ""
        self._header: str | None = ""  # None: inside a body
        self._kind = "content"
        self._recipient: str | None = None
        self._calls = 0

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._buf:
            if self._header is not None and not self._read_header(out):
                break
            if self._header is None and not self._read_body(out):
                break
        return out

    def finish(self) -> list[Piece]:
        text, self._buf = self._buf, ""
        if self._header is not None:  # a header never closed: not harmony after all
            text = self._header + text
            return [Piece("content", text)] if text.strip() else []
        if self._kind == "call":  # ended by the <|call|> stop token, or cut off
            return [self._call(text)] if text else []
        return [Piece(self._kind, text)] if text else []

    def _read_header(self, out: list[Piece]) -> bool:
        i = self._buf.find(MESSAGE)
        if i < 0:
            if len(self._header or "") + len(self._buf) > MAX_HEADER_CHARS:
                out.append(Piece("content", (self._header or "") + self._buf))
                self._header, self._buf, self._kind = None, "", "plain"
                return False
            return False
        header = (self._header or "") + self._buf[:i]
        self._buf = self._buf[i + len(MESSAGE):]
        self._header = None
        self._open(header)
        return True

    def _open(self, header: str) -> None:
        header = header.removeprefix(START).strip()
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        self._recipient = recipient.group(1) if recipient else None
        name = channel.group(1) if channel else "final"
        if self._recipient and self._recipient.startswith("functions.") and self._calls < MAX_CALLS:
            self._kind = "call"
        else:
            self._kind = "reasoning" if name == "analysis" else "content"

    def _read_body(self, out: list[Piece]) -> bool:
        if self._kind == "plain":  # not harmony: everything is content
            out.append(Piece("content", self._buf))
            self._buf = ""
            return False
        hits = [(self._buf.find(e), e) for e in ENDS if e in self._buf]
        if not hits:
            if self._kind != "call":
                keep = held_suffix(self._buf, ENDS)
                if len(self._buf) > keep:
                    out.append(Piece(self._kind, self._buf[:len(self._buf) - keep]))
                    self._buf = self._buf[len(self._buf) - keep:]
            return False
        i, end = min(hits)
        body, self._buf = self._buf[:i], self._buf[i + len(end):]
        if self._kind == "call":
            out.append(self._call(body))
        elif body:
            out.append(Piece(self._kind, body))
        self._header = ""
        return True

    def _call(self, body: str) -> Piece:
        try:
            args = json.loads(body) if body.strip() else {}
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return Piece("content", body)
        self._calls += 1
        return Piece("call", call=ToolCall(self._recipient.removeprefix("functions."), args))  # type: ignore[union-attr]
