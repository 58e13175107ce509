"""One message being generated: engine outputs through the reply parser into content blocks.
`thinking.budget_tokens` bounds the reasoning as every API's budget does (reasoning_budget.py)."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from mlxr.server.anthropic.output import BlockBuilder, stop_reason, usage
from mlxr.server.anthropic.schemas import MessagesRequest
from mlxr.server.chat_plan import ChatPlan
from mlxr.server.reasoning_budget import BudgetedReply
from mlxr.server.reply_parser import ReplyParser
from mlxr.server.session import Session
from mlxr.types import RequestOutput


def thinking_budget(body: MessagesRequest) -> int | None:
    """The reasoning's own bound, where thinking is enabled; else None."""
    thinking = body.thinking
    return thinking.budget_tokens if thinking is not None and thinking.type == "enabled" else None


class Run:
    def __init__(self, session: Session, body: MessagesRequest, plan: ChatPlan, prompt_tokens: int,
                 steps: BudgetedReply) -> None:
        self.session, self.body, self.plan, self.steps = session, body, plan, steps
        self.parser, self.out = ReplyParser(plan), BlockBuilder(body.stream)
        self.prompt_tokens, self.tokens, self.cached = prompt_tokens, 0, 0
        self.finish: str | None = None
        self.stop: str | int | None = None

    def apply(self, out: RequestOutput) -> None:
        o = out.outputs[0]
        self.tokens += len(o.token_ids)
        self.cached = max(self.cached, out.num_cached_tokens)
        self.out.add(self.parser.feed(o.text))
        if o.finish_reason is not None:
            self.finish, self.stop = o.finish_reason, o.stop_reason
            self.out.add(self.parser.finish())
            self.out.close()

    async def drive(self, item: tuple[int, RequestOutput] | None) -> AsyncIterator[None]:
        """Applies every output (yielding after each) until the reply ends."""
        while item is not None:
            self.apply(item[1])
            yield
            item = await self.steps.next()

    def stop_fields(self) -> dict[str, Any]:
        reason, sequence = stop_reason(self.finish, self.stop, self.body.stop_sequences, self.out.calls > 0)
        return {"stop_reason": reason, "stop_sequence": sequence}

    def message(self, done: bool) -> dict[str, Any]:
        s = self.session
        stop = self.stop_fields() if done else {"stop_reason": None, "stop_sequence": None}
        return {"id": s.request_id, "type": "message", "role": "assistant", "model": s.model,
                "content": self.out.blocks if done else [], **stop,
                "usage": usage(self.prompt_tokens, self.tokens if done else 0, self.cached)}
