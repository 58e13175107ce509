"""A chat choice's reply in OpenAI's shapes: `reasoning_content`, `tool_calls` (arguments as
JSON text, ids `call_...`) and finish_reason "tool_calls", whole or as stream deltas (a
call comes as its id and name, then its arguments in fragments as they are written)."""
from __future__ import annotations

from typing import Any

from mlxr.chat.tools import Piece, ToolCall
from mlxr.server.chat_plan import ChatPlan
from mlxr.server.reply_parser import Reply, ReplyParser, parse_reply


def needs_parsing(plan: ChatPlan) -> bool:
    return plan.fmt is not None or plan.markers is not None or plan.harmony


def finish_reason(reason: str | None, has_calls: bool) -> str | None:
    return "tool_calls" if has_calls and reason == "stop" else reason


def call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json}}


def message(plan: ChatPlan, text: str) -> tuple[dict[str, Any], bool]:
    """(the assistant message, whether it holds calls)."""
    if not needs_parsing(plan):
        return {"role": "assistant", "content": text}, False
    reply: Reply = parse_reply(plan, text)
    out: dict[str, Any] = {"role": "assistant", "content": reply.content if reply.content or not reply.calls else None}
    if reply.reasoning:
        out["reasoning_content"] = reply.reasoning
    if reply.calls:
        out["tool_calls"] = [call_json(c) for c in reply.calls]
    return out, bool(reply.calls)


class StreamedReply:
    """One choice while streaming: text in, delta dicts out."""

    def __init__(self, plan: ChatPlan) -> None:
        self._parser = ReplyParser(plan) if needs_parsing(plan) else None
        self.calls = 0
        self._index: dict[str, int] = {}  # call id -> its index in tool_calls

    def deltas(self, text: str, finished: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(the text delta, then one delta per call piece)."""
        if self._parser is None:
            return ({"content": text} if text else {}), []
        pieces = self._parser.feed(text) if text else []
        if finished:
            pieces += self._parser.finish()
        return self._text_delta(pieces), self._call_deltas(pieces)

    @staticmethod
    def _text_delta(pieces: list[Piece]) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        for kind, key in (("reasoning", "reasoning_content"), ("content", "content")):
            text = "".join(p.text for p in pieces if p.kind == kind)
            if text:
                delta[key] = text
        return delta

    def _call_deltas(self, pieces: list[Piece]) -> list[dict[str, Any]]:
        """A call's head (index, id, name) when it starts, then its arguments' fragments; a call
        given whole (never started) comes as its head and then all of its arguments."""
        out = []
        for p in pieces:
            if p.call is None or p.kind not in ("call_start", "call_args", "call"):
                continue
            new = p.call.id not in self._index
            if new:
                self._index[p.call.id] = len(self._index)
                out.append({"tool_calls": [{"index": self._index[p.call.id], "id": p.call.id, "type": "function",
                                            "function": {"name": p.call.name, "arguments": ""}}]})
            text = p.text if p.kind == "call_args" else p.call.arguments_json if p.kind == "call" and new else ""
            if p.kind == "call":
                self.calls += 1
            if text:
                out.append({"tool_calls": [{"index": self._index[p.call.id], "function": {"arguments": text}}]})
        return out
