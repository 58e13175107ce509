"""A reply, as it streams, split into content and tool calls, a call's arguments streamed as
they are written.

Pieces: "content" / "reasoning" text; "call_start" (a call's id and name, once its name is
complete, it names one of the tools and its arguments have begun); "call_args" (the next
fragment of a started call's arguments text); "call" (the call, parsed whole, after the last
fragment: the fragments of a started call concatenated equal its `arguments_json`). A block
that never parses falls back to content unless a call in it was started (that cannot be taken
back): then the started calls end as cut calls. Text that may be the start of a marker is held
until it is clear that it is not one. The split does not depend on how the text was chunked."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxr.chat.tools.calls import MAX_CALLS, ToolCall, calls_from_json, calls_from_json_prefix, cut_calls
from mlxr.chat.tools.formats import ToolFormat
from mlxr.chat.tools.json_stream import Partial, held_suffix


PREVIEW_STEP = 64  # a block being written is read again once it grows by 1/64 of its length


@dataclass
class Piece:
    kind: str  # "content" | "reasoning" | "call_start" | "call_args" | "call"
    text: str = ""
    call: ToolCall | None = None


class CallSplitter:
    """forced: the reply is nothing but a JSON call or list of calls (decoded under a grammar).
    tools: name -> parameters schema (None: any name is taken; formats that write values
    untyped read them by it). max_calls: 1 where parallel_tool_calls is false."""

    def __init__(self, fmt: ToolFormat, forced: bool = False, tools: dict[str, Any] | None = None,
                 max_calls: int = MAX_CALLS) -> None:
        self.fmt, self.forced, self.tools = fmt, forced, tools
        self.max_calls = min(max_calls, MAX_CALLS)
        self._buf = ""
        self._marker: str | None = None  # the start marker of the block being read
        self._at_start = True  # nothing but whitespace seen yet
        self._calls = 0
        self._space = ""  # whitespace after a call, sent only if more content follows
        self._started: list[ToolCall] = []  # the calls of the block being read that were started
        self._sent: list[str] = []  # the arguments text sent for each
        self._previewed = 0  # the length of the block's text when it was last read
        self._said = False  # content other than whitespace was given (formats whose calls open the reply)

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        if self.forced:
            return self._preview(self._buf, json_only=True)
        return self._scan(final=False)

    def finish(self) -> list[Piece]:
        if self.forced:
            # Unparsable under the call grammar means cut off (max_tokens): the call as far as
            # written, as OpenAI gives one (finish_reason "length", the arguments' partial text).
            calls = calls_from_json(self._buf.strip())
            if calls:
                return self._give(calls)
            out = self._stream(self.fmt.preview(self._buf, self.tools, json_only=True, final=True))
            calls = cut_calls(self._buf, self.fmt.args_key)
            return out + self._give(calls) if calls or self._started else self._content(self._buf)
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
                    body = self._buf[:len(self._buf) - held_suffix(self._buf, (end,))] if end else self._buf
                    out += self._preview(body)
                    break
                out += self._close_block(self._buf[:i], closed=True)
                self._buf = self._buf[i + len(end):]
                continue
            if self._at_start and self.fmt.bare_json:
                head = self._buf.lstrip()
                if not head:
                    break
                if any(head.startswith(m) for m in self.fmt.starts):
                    self._at_start = False  # the marker the detokenizer kept: a block as usual
                    continue
                if not final and any(m.startswith(head) for m in self.fmt.starts):
                    break  # maybe the marker
                if head[0] in "[{":
                    found = calls_from_json_prefix(head)
                    if found is None:
                        if final and self._started:  # cut off: the started calls, as far as written
                            out += self._stream(self.fmt.preview(head, self.tools, json_only=True, final=True))
                            out += self._give([])
                            self._buf = ""
                            break
                        if final:
                            self._at_start = False
                            continue
                        out += self._preview(head, json_only=True)
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
        if self.fmt.opens_reply and (self._said or self._buf.strip()[:1] not in ("", *(m[:1] for m in self.fmt.starts))):
            self._said = True  # calls only open the reply: the rest is content as it comes
            return self._content(self._buf_taken())
        hits = [(self._buf.find(m), m) for m in self.fmt.starts if m in self._buf]
        if not hits:
            keep = held_suffix(self._buf, self.fmt.starts)
            text, self._buf = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
            return self._content(text)
        i, marker = min(hits)
        out = self._content(self._buf[:i])
        self._buf, self._marker = self._buf[i + len(marker):], marker
        return out

    def _buf_taken(self) -> str:
        text, self._buf = self._buf, ""
        return text

    def _close_block(self, body: str, closed: bool) -> list[Piece]:
        marker, self._marker, self._previewed = self._marker or "", None, 0
        calls = self.fmt.parse_block(body, self.tools)
        if calls or self._started:
            return self._give(calls or [])
        return self._content(marker + body + (self.fmt.end or "" if closed else ""))

    def _preview(self, body: str, json_only: bool = False) -> list[Piece]:
        """Pieces for a block still being written, read again only once it has grown by a
        1/PREVIEW_STEP part: each reading scans all of it, so a long call costs O(n) readings
        of O(n) at most PREVIEW_STEP per doubling, not one per token."""
        if len(body) - self._previewed < max(1, len(body) // PREVIEW_STEP):
            return []
        self._previewed = len(body)
        return self._stream(self.fmt.preview(body, self.tools, json_only=json_only))

    def _room(self) -> int:
        return max(self.max_calls - self._calls, 0)

    def _stream(self, partials: list[Partial]) -> list[Piece]:
        """call_start / call_args pieces for what the partial calls show beyond what was sent."""
        out: list[Piece] = []
        for i, p in enumerate(partials[:self._room()]):
            if i == len(self._started):
                if not (p.name and p.args) or (self.tools is not None and p.name not in self.tools):
                    break
                call = ToolCall(p.name, {}, id=p.id) if p.id else ToolCall(p.name, {})
                self._started.append(call)
                self._sent.append("")
                out.append(Piece("call_start", call=call))
            out += self._more_args(i, p.args)
        return out

    def _more_args(self, i: int, args: str) -> list[Piece]:
        sent = self._sent[i]
        if len(args) <= len(sent) or not args.startswith(sent):
            return []
        self._sent[i] = args
        return [Piece("call_args", args[len(sent):], self._started[i])]

    def _give(self, calls: list[ToolCall]) -> list[Piece]:
        """The block's calls, each started call finished with the rest of its arguments."""
        calls = calls[:self._room()]
        started, sent = self._started, self._sent
        self._started, self._sent, self._previewed = [], [], 0
        out: list[Piece] = []
        for i, call in enumerate(calls):
            if i < len(started):
                call.id = started[i].id
                if call.cut is not None and sent[i]:  # the arguments as far as they were streamed
                    call.cut_off(sent[i])
                out += self._finish_started(call, started[i], sent[i])
        for i in range(len(calls), len(started)):  # started, but the block did not parse into them
            call = ToolCall(started[i].name, {}, id=started[i].id).cut_off(sent[i])
            calls.append(call)
        self._calls += len(calls)
        self._at_start = False
        return out + [Piece("call", call=c) for c in calls]

    @staticmethod
    def _finish_started(call: ToolCall, started: ToolCall, sent: str) -> list[Piece]:
        full = call.arguments_json
        if not full.startswith(sent):  # parsed other than it read while streaming: the parse wins
            return []
        return [Piece("call_args", full[len(sent):], started)] if len(full) > len(sent) else []

    def _content(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self._calls and not (self._space + text).strip():
            self._space += text
            return []
        text, self._space = self._space + text, ""
        return [Piece("content", text)]
