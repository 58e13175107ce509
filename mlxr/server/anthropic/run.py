"""One message being generated: engine outputs through the reply parser into content blocks.
With `thinking.budget_tokens` on a model with reasoning markers the reply runs in two steps:
the reasoning, stopped at the end marker or after the budget; then, the marker written where
the model did not write it, the rest of the reply after it, within what max_tokens leaves."""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from mlxr.server.anthropic.output import BlockBuilder, stop_reason, usage
from mlxr.server.anthropic.schemas import MessagesRequest
from mlxr.server.chat_plan import ChatPlan
from mlxr.server.prompt_work import off_loop
from mlxr.server.reply_parser import ReplyParser
from mlxr.server.session import Session
from mlxr.types import RequestOutput, SamplingParams


def thinking_budget(body: MessagesRequest, plan: ChatPlan) -> int | None:
    """The reasoning's own bound, where the model reasons between markers; else None."""
    thinking = body.thinking
    if thinking is None or thinking.type != "enabled" or plan.markers is None or plan.reasoning is None:
        return None
    return thinking.budget_tokens


def first_params(params: SamplingParams, budget: int | None, plan: ChatPlan) -> SamplingParams:
    if budget is None or plan.markers is None:
        return params
    return replace(params, max_tokens=budget, stop=[plan.markers.end, *params.stop])


class Run:
    def __init__(self, session: Session, body: MessagesRequest, plan: ChatPlan, prompt_tokens: int,
                 params: SamplingParams, budget: int | None) -> None:
        self.session, self.body, self.plan, self.params = session, body, plan, params
        self.parser, self.out = ReplyParser(plan), BlockBuilder(body.stream)
        self.prompt_tokens, self.tokens, self.cached = prompt_tokens, 0, 0
        self.finish: str | None = None
        self.stop: str | int | None = None
        self._thinking_step = budget is not None  # the budgeted reasoning runs first
        self._thought = ""  # what that step wrote

    def apply(self, out: RequestOutput) -> None:
        o = out.outputs[0]
        self.tokens += len(o.token_ids)
        self.cached = max(self.cached, out.num_cached_tokens)
        if self._thinking_step:
            self._thought += o.text
        self.out.add(self.parser.feed(o.text))
        if o.finish_reason is not None:
            self.finish, self.stop = o.finish_reason, o.stop_reason
            if not self._thinking_step:
                self._end()

    def _end(self) -> None:
        self.out.add(self.parser.finish())
        self.out.close()

    async def drive(self, item: tuple[int, RequestOutput] | None) -> AsyncIterator[None]:
        """Applies every output (yielding after each) until the reply ends."""
        while True:
            while item is not None:
                self.apply(item[1])
                yield
                item = await self.session.next()
            if not await self._continue():
                return
            item = await self.session.next()

    async def _continue(self) -> bool:
        """After the reasoning step: start the rest of the reply, or end it here (the model
        ended its reply or a stop sequence matched)."""
        if not self._thinking_step:
            return False
        self._thinking_step = False
        end, opener = self.plan.markers.end, self.plan.reasoning[0]  # type: ignore[union-attr]
        if self.stop != end and self.finish != "length":
            self._end()
            return False
        # Out of budget inside the reasoning: close it (a model that never opened it goes on as it was).
        inside = self.stop == end or opener == "" or opener in self._thought
        closing = end if inside else ""
        self.out.add(self.parser.feed(closing))
        served = self.session.served
        ids = await off_loop(served.tokenizer.encode, self.plan.prompt_text + self._thought + closing, False)
        left = min(self.body.max_tokens - self.tokens, served.context_length - len(ids))
        if left <= 0:
            self.finish, self.stop = "length", None
            self._end()
            return False
        params = replace(self.params, max_tokens=left, structured_outputs=self.plan.constraint)
        await self.session.restart(ids, params, "answer")
        self.finish, self.stop = None, None
        return True

    def stop_fields(self) -> dict[str, Any]:
        reason, sequence = stop_reason(self.finish, self.stop, self.body.stop_sequences, self.out.calls > 0)
        return {"stop_reason": reason, "stop_sequence": sequence}

    def message(self, done: bool) -> dict[str, Any]:
        s = self.session
        stop = self.stop_fields() if done else {"stop_reason": None, "stop_sequence": None}
        return {"id": s.request_id, "type": "message", "role": "assistant", "model": s.model,
                "content": self.out.blocks if done else [], **stop,
                "usage": usage(self.prompt_tokens, self.tokens if done else 0, self.cached)}
