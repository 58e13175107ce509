"""POST /v1/responses: OpenAI's Responses API, stateless (no store, no previous_response_id).
Text or message-list input, instructions, function tools (function_call output items),
text.format json_schema / json_object, reasoning items, and the streaming events."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from mlxr.errors import InvalidParameterError
from mlxr.server.chat_plan import ChatPlan
from mlxr.server.images import ImageSources
from mlxr.server.openai.prompts import check_fits, render_plan
from mlxr.server.openai.responses_input import (
    ResponsesRequest, chat_messages, chat_tools, check_stateless, responses_param, text_constraint,
)
from mlxr.server.openai.responses_output import OutputBuilder, response_object, usage
from mlxr.server.openai.sse import error_chunk, stream_response
from mlxr.server.reasoning_budget import BudgetedReply, effort_budget
from mlxr.server.reply_budget import reply_budget
from mlxr.server.reply_parser import ReplyParser
from mlxr.server.session import Session, status_of
from mlxr.types import RequestOutput, SamplingParams, StructuredOutputsParams

router = APIRouter()
ROUTE = "/v1/responses"


@router.post(ROUTE)
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    session = await Session.open(request, body.model, ROUTE, "resp_")  # OpenAI's form
    try:
        return await _respond(session, body)
    except BaseException as e:
        await session.fail(e)
        raise


async def _render(session: Session, body: ResponsesRequest,
                  constraint: StructuredOutputsParams | None) -> tuple[list[int], ChatPlan]:
    tokenizer, context = session.served.tokenizer, session.served.context_length
    images = ImageSources(session.served.args.vision, session.request.app.state.config.allow_remote_images)
    messages, tools = chat_messages(body, images), chat_tools(body)
    effort = body.reasoning.effort if body.reasoning else None
    thinking = None if effort is None else effort != "none"
    try:
        return await render_plan(tokenizer, context, "input", messages, tools, tool_choice=body.tool_choice,
                                 parallel=body.parallel_tool_calls, thinking=thinking, effort=effort,
                                 other_constraint=constraint is not None, images=images)
    except InvalidParameterError as e:
        raise responses_param(e) from None


class _Run:
    """One response being generated: its parser, output items and token counts."""

    def __init__(self, session: Session, body: ResponsesRequest, plan: ChatPlan, prompt_tokens: int,
                 steps: BudgetedReply) -> None:
        self.session, self.body, self.steps = session, body, steps
        self.parser, self.out = ReplyParser(plan), OutputBuilder()
        self.prompt_tokens, self.tokens, self.cached, self.finish = prompt_tokens, 0, 0, None

    def apply(self, out: RequestOutput) -> None:
        o = out.outputs[0]
        self.tokens += len(o.token_ids)
        self.cached = out.num_cached_tokens
        self.out.add(self.parser.feed(o.text))
        if o.finish_reason is not None:
            self.finish = o.finish_reason
            self.out.add(self.parser.finish())
            self.out.close("incomplete" if o.finish_reason == "length" else "completed")

    def response(self, done: bool) -> dict[str, Any]:
        s = self.session
        status = ("incomplete" if self.finish == "length" else "completed") if done else "in_progress"
        return response_object(s.request_id, s.created, s.model, self.body, self.out.items if done else [], status,
                               usage(self.prompt_tokens, self.tokens, self.cached) if done else None)


async def _respond(session: Session, body: ResponsesRequest) -> Response:
    check_stateless(body)
    constraint = text_constraint(body)
    ids, plan = await _render(session, body, constraint)
    check_fits(len(ids), session.served.context_length, body.max_output_tokens, param="input")
    budget = reply_budget(session.request, body.max_output_tokens, len(ids), session.served.context_length)
    d = session.served.sampling
    params = SamplingParams(max_tokens=budget, seed=body.seed,
                            temperature=d.get("temperature", 1.0) if body.temperature is None else body.temperature,
                            top_p=d.get("top_p", 1.0) if body.top_p is None else body.top_p,
                            top_k=d.get("top_k", 0), min_p=d.get("min_p", 0.0),
                            repetition_penalty=d.get("repetition_penalty", 1.0),
                            structured_outputs=plan.constraint_for(constraint), priority=body.priority,
                            skip_special_tokens=plan.skip_special_tokens)
    effort = body.reasoning.effort if body.reasoning else None
    run = _Run(session, body, plan, len(ids), BudgetedReply(session, plan, params, effort_budget(effort)))
    run.steps.start(ids)
    first = await run.steps.next()  # admission errors surface here, before any header is sent
    if body.stream:
        return stream_response(session, _events(run, first))
    item = first
    while item is not None:
        run.apply(item[1])
        item = await run.steps.next()
    await session.close(200)
    return JSONResponse(run.response(done=True))


def _event(seq: int, event: dict[str, Any]) -> str:
    event = {**event, "sequence_number": seq}
    return f"event: {event['type']}\ndata: {orjson.dumps(event).decode()}\n\n"


async def _events(run: _Run, item: tuple[int, RequestOutput] | None) -> AsyncIterator[str]:
    session, seq = run.session, 0
    try:
        for kind in ("response.created", "response.in_progress"):
            yield _event(seq, {"type": kind, "response": run.response(done=False)})
            seq += 1
        while item is not None:
            run.apply(item[1])
            for event in run.out.events:
                yield _event(seq, event)
                seq += 1
            run.out.events.clear()
            item = await run.steps.next()
        final = run.response(done=True)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield _event(seq, {"type": kind, "response": final})
        session.outcome = (200, None)
    except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band
        session.outcome = (status_of(e), str(e) or type(e).__name__)
        err = error_chunk(e)["error"]
        yield _event(seq, {"type": "error", "code": str(err["code"]), "message": err["message"], "param": err["param"]})
