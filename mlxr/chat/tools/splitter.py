"""A reply, as it streams, split into content and tool calls.

A call is held until it is complete and parses, then given whole: a malformed or cut-off call
falls back to content (nothing is sent that has to be taken back). Text that may be the start
of a marker is held until it is clear that it is not one. The split does not depend on how
the text was chunked, so a streamed reply and the same reply in one piece split alike."""
from __future__ import annotations

from dataclasses import dataclass

from mlxr.chat.tools.calls import MAX_CALLS, ToolCall, calls_from_json, calls_from_json_prefix, cut_calls
from mlxr.chat.tools.formats import ToolFormat


@dataclass
class Piece:
    kind: str  # "content" | "reasoning" | "call"
    text: str = ""
    call: ToolCall | None = None


def held_suffix(text: str, markers: tuple[str, ...]) -> int:
    """How many trailing characters of text could begin one of the markers."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


class CallSplitter:
    """forced: the reply is nothing but a JSON call or list of calls (decoded under a grammar)."""

    def __init__(self, fmt: ToolFormat, forced: bool = False) -> None:
        self.fmt, self.forced = fmt, forced
        self._buf = ""
        self._marker: str | None = None  # the start marker of the block being read
        self._at_start = True  # nothing but whitespace seen yet
        self._calls = 0
        self._space = ""  # whitespace after a call, sent only if more content follows

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        return [] if self.forced else self._scan(final=False)

    def finish(self) -> list[Piece]:
        if self.forced:
            # Unparsable under the call grammar means cut off (max_tokens): the call as far as
            # written, as OpenAI gives one (finish_reason "length", the arguments' partial text).
            calls = calls_from_json(self._buf.strip()) or cut_calls(self._buf, self.fmt.args_key)
            return self._give(calls) if calls else self._content(self._buf)
        out = self._scan(final=True)
        if self._marker is not None:  # a block the reply never closed: parse what there is
            out += self._close_block(self._buf, closed=False)
        elif self._buf:
            out += self._content(self._buf)
        self._buf = ""
        return out

    def _scan(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        while self._buf:
            if self._marker is not None:
                end = self.fmt.end
                i = self._buf.find(end) if end else -1
                if i < 0:
                    break
                out += self._close_block(self._buf[:i], closed=True)
                self._buf = self._buf[i + len(end):]
                continue
            if self._at_start and self.fmt.bare_json:
                head = self._buf.lstrip()
                if not head:
                    break
                if head[0] in "[{":
                    found = calls_from_json_prefix(head)
                    if found is None:
                        if final:
                            self._at_start = False
                            continue
                        break
                    out += self._give(found[0])
                    self._buf = found[1]
                    continue
            self._at_start = False
            out += self._open_block()
            if self._marker is None:
                break
        return out

    def _open_block(self) -> list[Piece]:
        hits = [(self._buf.find(m), m) for m in self.fmt.starts if m in self._buf]
        if not hits:
            keep = held_suffix(self._buf, self.fmt.starts)
            text, self._buf = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
            return self._content(text)
        i, marker = min(hits)
        out = self._content(self._buf[:i])
        self._buf, self._marker = self._buf[i + len(marker):], marker
        return out

    def _close_block(self, body: str, closed: bool) -> list[Piece]:
        marker, self._marker = self._marker or "", None
        calls = self.fmt.parse_block(body)
        if calls and self._calls + len(calls) <= MAX_CALLS:
            return self._give(calls)
        return self._content(marker + body + (self.fmt.end or "" if closed else ""))

    def _give(self, calls: list[ToolCall]) -> list[Piece]:
        self._calls += len(calls)
        self._at_start = False
        return [Piece("call", call=c) for c in calls]

    def _content(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self._calls and not (self._space + text).strip():
            self._space += text
            return []
        text, self._space = self._space + text, ""
        return [Piece("content", text)]
