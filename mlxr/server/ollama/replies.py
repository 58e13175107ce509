"""A chat reply in Ollama's shape: `message.thinking`, and `message.tool_calls` with the
arguments as an object. A streamed call comes in one chunk as soon as it is complete (as
Ollama sends them): its arguments' fragments are not sent apart."""
from __future__ import annotations

from typing import Any

from mlxr.chat.tools import Piece
from mlxr.server.chat_plan import ChatPlan
from mlxr.server.reply_parser import Reply, ReplyParser, parse_reply


def _message(reply: Reply) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.reasoning:
        out["thinking"] = reply.reasoning
    if reply.calls:
        out["tool_calls"] = [{"id": c.id, "function": {"index": i, "name": c.name, "arguments": c.arguments}}
                             for i, c in enumerate(reply.calls)]
    return out


def whole_message(plan: ChatPlan | None, text: str) -> dict[str, Any]:
    if plan is None or (plan.fmt is None and plan.markers is None and not plan.harmony):
        return {"role": "assistant", "content": text}
    return _message(parse_reply(plan, text))


class StreamedMessage:
    def __init__(self, plan: ChatPlan | None) -> None:
        parse = plan is not None and (plan.fmt is not None or plan.markers is not None or plan.harmony)
        self._parser = ReplyParser(plan) if parse else None  # type: ignore[arg-type]

    def delta(self, text: str, finished: bool) -> dict[str, Any] | None:
        """The message of one NDJSON chunk, or None when nothing is ready to send."""
        if self._parser is None:
            return {"role": "assistant", "content": text} if text else None
        pieces: list[Piece] = self._parser.feed(text) if text else []
        if finished:
            pieces += self._parser.finish()
        pieces = [p for p in pieces if p.kind in ("content", "reasoning", "call")]
        if not pieces:
            return None
        reply = Reply()
        reply.add(pieces)
        return _message(reply)
