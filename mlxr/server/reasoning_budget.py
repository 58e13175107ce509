"""A reasoning token budget, the same on every API (OpenAI `thinking_token_budget` and
`reasoning_effort`, the Responses API's `reasoning.effort`, Anthropic `thinking.budget_tokens`,
Ollama `think` levels): where the model reasons between markers, the reply runs in two engine
requests. The first is the reasoning, stopped at the end marker or after the budget; then,
the end marker written where the model did not write it, the rest of the reply follows after
it within what max_tokens leaves. To the API code the two are one stream of outputs: the
first request's finish is hidden and the marker comes as text in its last output."""
from __future__ import annotations

import os
from dataclasses import replace

from mlxr.errors import InvalidParameterError
from mlxr.server.chat_plan import ChatPlan
from mlxr.server.prompt_work import off_loop
from mlxr.server.session import Session
from mlxr.types import RequestOutput, SamplingParams

# Reasoning tokens per effort level (Responses reasoning.effort, OpenAI reasoning_effort,
# Ollama think levels); "high" and think=true are bounded by max_tokens alone.
EFFORT_BUDGETS = {"minimal": 256, "low": 1024, "medium": 4096}
MAX_BUDGET = 1 << 20  # the largest budget a request may ask for


def effort_budgets() -> dict[str, int]:
    """EFFORT_BUDGETS as MLXR_REASONING_EFFORT_TOKENS changes them ("low=512,medium=2048")."""
    budgets = dict(EFFORT_BUDGETS)
    for entry in os.environ.get("MLXR_REASONING_EFFORT_TOKENS", "").split(","):
        level, _, value = entry.partition("=")
        if level.strip() in budgets and value.strip().isdigit() and int(value) <= MAX_BUDGET:
            budgets[level.strip()] = int(value)
    return budgets


def effort_budget(effort: str | bool | None) -> int | None:
    return effort_budgets().get(effort) if isinstance(effort, str) else None


def check_budget(param: str, budget: int | None) -> int | None:
    if budget is not None and not 0 <= budget <= MAX_BUDGET:
        raise InvalidParameterError(param, f"must be between 0 and {MAX_BUDGET}, got {budget}")
    return budget


def applies(plan: ChatPlan, budget: int | None) -> int | None:
    """The budget where the reply reasons between markers (thinking not turned off); else None."""
    return budget if budget is not None and plan.markers is not None and plan.reasoning is not None else None


class BudgetedReply:
    """session.start / session.next for one reply (n = 1), with the reasoning bounded."""

    def __init__(self, session: Session, plan: ChatPlan, params: SamplingParams, budget: int | None) -> None:
        self.session, self.plan, self.params = session, plan, params
        self.budget = applies(plan, budget)
        self._thinking = self.budget is not None  # the first request runs
        self._thought = ""  # what it wrote
        self._ids: list[int] = []  # the prompt, then the tokens the reasoning wrote

    def start(self, ids: list[int]) -> None:
        self._ids = list(ids)
        self._prompt_tokens = len(ids)
        params = self.params
        if self._thinking:
            params = replace(params, max_tokens=min(self.budget, params.max_tokens), stop=[self.plan.markers.end, *params.stop])  # type: ignore[union-attr]
        self.session.start([ids], params)

    async def next(self) -> tuple[int, RequestOutput] | None:
        item = await self.session.next()
        if not self._thinking or item is None:
            return item
        index, out = item
        o = out.outputs[0]
        self._thought += o.text
        self._ids += o.token_ids
        if o.finish_reason is None:
            return item
        self._thinking = False
        return await self._answer(index, out)

    async def _answer(self, index: int, out: RequestOutput) -> tuple[int, RequestOutput]:
        """The reasoning ended: pass the model's own end of reply on, or close the reasoning
        (out of budget or at its marker) and start the answer."""
        o = out.outputs[0]
        end, opener = self.plan.markers.end, self.plan.reasoning[0]  # type: ignore[union-attr]
        if o.stop_reason != end and o.finish_reason != "length":
            return index, out
        # A model that never opened its reasoning goes on as it was.
        inside = o.stop_reason == end or opener == "" or opener in self._thought
        closing = end if inside else ""
        served = self.session.served
        # The answer continues from the tokens written, not from their text encoded again (a
        # random or byte-level model's text can encode to far more tokens). The marker matched
        # as a stop string is among them; one forced is encoded after them.
        forced = closing if o.stop_reason != end else ""
        ids = self._ids + (await off_loop(served.tokenizer.encode, forced, False) if forced else [])
        written = len(self._ids) - self._prompt_tokens
        left = min(self.params.max_tokens - written, served.context_length - len(ids))
        if left <= 0:
            return index, _with(out, o.text + closing, "length")
        constraint = self.params.structured_outputs  # the answer's: no reasoning before it now
        params = replace(self.params, max_tokens=left,
                         structured_outputs=replace(constraint, reasoning=None) if constraint else None)
        await self.session.restart(ids, params, "answer")
        return index, _with(out, o.text + closing, None)


def _with(out: RequestOutput, text: str, finish: str | None) -> RequestOutput:
    o = replace(out.outputs[0], text=text, finish_reason=finish, stop_reason=None)
    return replace(out, outputs=[o], finished=finish is not None)
