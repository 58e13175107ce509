"""One choice's reply, read back with its ChatPlan: reasoning split off first, then tool calls
out of what remains (a harmony reply: its channels, chat/harmony.py, give all three). Streaming and whole replies go through the same feed/finish; a whole
reply keeps the "call" pieces only (the call_start / call_args pieces are for streams)."""
from __future__ import annotations

from dataclasses import dataclass, field

from mlxr.chat.harmony import HarmonySplitter
from mlxr.chat.reasoning import ReasoningSplitter
from mlxr.chat.tools import CallSplitter, Piece, ToolCall
from mlxr.server.chat_plan import ChatPlan


class ReplyParser:
    def __init__(self, plan: ChatPlan) -> None:
        self._harmony = HarmonySplitter() if plan.harmony else None
        self._think = ReasoningSplitter(plan.markers, plan.prompt_text) if plan.markers else None
        self._calls = (CallSplitter(plan.fmt, plan.forced, plan.tool_params or None, plan.max_calls)
                       if plan.fmt and not plan.harmony else None)
        self._calls_allowed = plan.fmt is not None

    def feed(self, text: str) -> list[Piece]:
        if self._harmony is not None:
            return self._harmony_pieces(self._harmony.feed(text))
        return self._route(self._think.feed(text) if self._think else [Piece("content", text)])

    def finish(self) -> list[Piece]:
        if self._harmony is not None:
            return self._harmony_pieces(self._harmony.finish())
        out = self._route(self._think.finish()) if self._think else []
        return out + (self._calls.finish() if self._calls else [])

    def _harmony_pieces(self, pieces: list[Piece]) -> list[Piece]:
        """tool_choice "none" (or no tools): a call the model writes anyway is shown as text."""
        if self._calls_allowed:
            return pieces
        return [Piece("content", p.call.arguments_json) if p.kind == "call" and p.call else p for p in pieces]

    def _route(self, pieces: list[Piece]) -> list[Piece]:
        out: list[Piece] = []
        for p in pieces:
            if p.kind == "content" and self._calls is not None:
                out += self._calls.feed(p.text)
            elif p.text:
                out.append(p)
        return out


@dataclass
class Reply:
    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def add(self, pieces: list[Piece]) -> None:
        for p in pieces:
            if p.kind == "call" and p.call is not None:
                self.calls.append(p.call)
            elif p.kind == "reasoning":
                self.reasoning += p.text
            elif p.kind == "content":
                self.content += p.text


def parse_reply(plan: ChatPlan, text: str) -> Reply:
    parser, reply = ReplyParser(plan), Reply()
    reply.add(parser.feed(text))
    reply.add(parser.finish())
    return reply
