"""POST /v1/chat/completions."""
from __future__ import annotations

from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from mlxr.errors import InvalidParameterError
from mlxr.server.chat_plan import ChatPlan
from mlxr.server.images import ImageSources
from mlxr.server.openai.choices import Choice, Choices, chat_logprobs
from mlxr.server.openai.prompt_scores import score_prompts, vllm_prompt_logprobs
from mlxr.server.openai.replies import StreamedReply, finish_reason, message
from mlxr.server.openai.prompts import check_fits, check_unsupported, render_chat, sampling_params
from mlxr.server.openai.schemas import ChatCompletionRequest
from mlxr.server.openai.sse import events, stream_response
from mlxr.server.reasoning_budget import BudgetedReply, applies, check_budget, effort_budget
from mlxr.server.reply_budget import reply_budget
from mlxr.server.session import Session
from mlxr.types import CompletionOutput, RequestOutput

router = APIRouter()
ROUTE = "/v1/chat/completions"


@router.post(ROUTE)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    session = await Session.open(request, body.model, ROUTE, "chatcmpl-")
    try:
        return await _chat(session, body)
    except BaseException as e:
        await session.fail(e)
        raise


def _top_logprobs(body: ChatCompletionRequest) -> int | None:
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidParameterError("top_logprobs", "requires logprobs: true")
    return (body.top_logprobs or 0) if body.logprobs else None


def _budget(body: ChatCompletionRequest, plan: ChatPlan) -> int | None:
    """thinking_token_budget, else the reasoning_effort level's (reasoning_budget.py)."""
    budget = check_budget("thinking_token_budget", body.thinking_token_budget)
    budget = effort_budget(body.reasoning_effort) if budget is None else budget
    if applies(plan, budget) is not None and (body.n or 1) > 1:
        raise InvalidParameterError("thinking_token_budget", "a reasoning budget needs n = 1")
    return budget


async def _chat(session: Session, body: ChatCompletionRequest) -> Response:
    check_unsupported(body)
    served = session.served
    images = ImageSources(served.args.vision, session.request.app.state.config.allow_remote_images)
    ids, plan = await render_chat(served.tokenizer, body, served.context_length, images)
    asked = body.max_completion_tokens or body.max_tokens
    max_tokens = reply_budget(session.request, asked, len(ids), served.context_length)
    top_n = _top_logprobs(body)
    params = sampling_params(body, max_tokens, top_n, served.sampling)
    if plan.constraint is not None and params.structured_outputs is not None:
        raise InvalidParameterError("tool_choice", "a forced tool call cannot be combined with another constraint")
    params = replace(params, structured_outputs=plan.constraint_for(params.structured_outputs),
                     skip_special_tokens=plan.skip_special_tokens)
    check_fits(len(ids), served.context_length, max_tokens)
    choices = Choices(1, body.n)
    choices.prompt_tokens = len(ids)
    fmt = _ChatFormat(session, choices, top_n, body, plan)
    if body.prompt_logprobs is not None and images:
        raise InvalidParameterError("prompt_logprobs", "is not supported with images")
    if body.prompt_logprobs is not None:  # vLLM's extra: the rendered prompt's tokens, scored
        entries = (await session.watched(score_prompts(served.engine, [ids], body.prompt_logprobs)))[0]
        fmt.prompt_logprobs = vllm_prompt_logprobs(ids, entries, body.prompt_logprobs)
    steps = BudgetedReply(session, plan, params, _budget(body, plan))
    steps.start(ids)
    first = await steps.next()  # admission errors surface here, before any header is sent
    if body.stream:
        return stream_response(session, events(session, first, fmt.head(), fmt.chunks, fmt.tail, steps))
    item = first
    while item is not None:
        choices.apply(*item)
        item = await steps.next()
    await session.close(200)
    return JSONResponse(fmt.full())


class _ChatFormat:
    def __init__(self, session: Session, choices: Choices, top_n: int | None, body: ChatCompletionRequest,
                 plan: ChatPlan) -> None:
        self.session, self.choices, self.top_n, self.plan = session, choices, top_n, plan
        self.replies = [StreamedReply(plan) for _ in choices.items]
        opts = body.stream_options
        self.include_usage = bool(body.stream and opts and opts.include_usage)
        self.prompt_logprobs: list[dict | None] | None = None  # vLLM's, at the top level

    def _envelope(self, kind: str, choices: list[dict]) -> dict:
        s = self.session
        out = {"id": s.request_id, "object": kind, "created": s.created, "model": s.model, "choices": choices}
        if self.include_usage:
            out["usage"] = None
        return out

    def head(self) -> list[dict]:
        first = [{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None} for c in self.choices.items]
        chunk = self._envelope("chat.completion.chunk", first)
        if self.prompt_logprobs is not None:
            chunk["prompt_logprobs"] = self.prompt_logprobs
        return [chunk]

    def chunks(self, prompt_index: int, out: RequestOutput) -> list[dict]:
        return [self._envelope("chat.completion.chunk", [d])
                for c, o in self.choices.apply(prompt_index, out) for d in self._deltas(c, o)]

    def _deltas(self, choice: Choice, o: CompletionOutput) -> list[dict]:
        logprobs = None
        if self.top_n is not None and o.token_ids:
            logprobs = chat_logprobs(o.token_ids, o.logprobs or [], self.top_n)
        ending = choice.finish_reason is not None and not choice.finish_sent
        reply = self.replies[choice.index]
        delta, call_deltas = reply.deltas(o.text, ending)
        finish = finish_reason(choice.finish_reason, reply.calls > 0) if ending else None
        choice.finish_sent = choice.finish_reason is not None
        items = [(delta, logprobs), *((d, None) for d in call_deltas)]
        return [{"index": choice.index, "delta": d, "logprobs": lp,
                 "finish_reason": finish if i == len(items) - 1 else None} for i, (d, lp) in enumerate(items)]

    def tail(self) -> list[dict]:
        if not self.include_usage:
            return []
        last = self._envelope("chat.completion.chunk", [])
        last["usage"] = self.choices.usage()
        return [last]

    def full(self) -> dict:
        out = self._envelope("chat.completion", [self._message(c) for c in self.choices.items])
        out["usage"] = self.choices.usage()
        if self.prompt_logprobs is not None:
            out["prompt_logprobs"] = self.prompt_logprobs
        return out

    def _message(self, c: Choice) -> dict:
        logprobs = chat_logprobs(c.token_ids, c.logprobs, self.top_n) if self.top_n is not None else None
        msg, has_calls = message(self.plan, c.text)
        return {"index": c.index, "message": msg, "logprobs": logprobs,
                "finish_reason": finish_reason(c.finish_reason, has_calls)}
