"""POST /v1/messages (Anthropic's Messages API, streamed or not) and
POST /v1/messages/count_tokens, on the chat plan the OpenAI routes use."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from mlxr.errors import InvalidParameterError, MLXRError
from mlxr.loader.sampling_defaults import SamplingDefaults
from mlxr.server.anthropic.errors import ROUTE, error_body
from mlxr.server.anthropic.history import anthropic_param, chat_messages, chat_tools, tool_choice
from mlxr.server.anthropic.run import Run, thinking_budget
from mlxr.server.anthropic.schemas import Conversation, MessagesRequest
from mlxr.server.chat_plan import ChatPlan
from mlxr.server.images import ImageSources
from mlxr.server.openai.prompts import check_fits, render_plan
from mlxr.server.openai.sse import stream_response
from mlxr.server.openai.structured import vllm_constraint
from mlxr.server.reasoning_budget import BudgetedReply
from mlxr.server.session import Session, status_of
from mlxr.types import RequestOutput, SamplingParams

router = APIRouter()
COUNT_ROUTE = ROUTE + "/count_tokens"


@router.post(ROUTE)
async def create_message(body: MessagesRequest, request: Request) -> Response:
    session = await Session.open(request, body.model, ROUTE, "msg_")
    try:
        return await _respond(session, body)
    except BaseException as e:
        await session.fail(e)
        raise


@router.post(COUNT_ROUTE)
async def count_tokens(body: Conversation, request: Request) -> Response:
    session = await Session.open(request, body.model, COUNT_ROUTE, "msg_")
    try:
        ids, _ = await _render(session, body)
    except BaseException as e:
        await session.fail(e)
        raise
    await session.close(200)
    return JSONResponse({"input_tokens": len(ids)})


def _thinking(body: Conversation) -> bool | None:
    """enabled / disabled turn the template's thinking on or off; absent, adaptive and
    between_tools (the model decides) leave the template's default."""
    kind = body.thinking.type if body.thinking else None
    return {"enabled": True, "disabled": False}.get(kind or "")


async def _render(session: Session, body: Conversation) -> tuple[list[int], ChatPlan]:
    served = session.served
    choice, parallel = tool_choice(body.tool_choice, bool(body.tools))
    images = ImageSources(served.args.vision, session.request.app.state.config.allow_remote_images)
    try:
        messages = chat_messages(body, images)
        if images and body.thinking is not None and body.thinking.type == "enabled":
            # Its continuation past the budget re-renders the prompt as text, without the images.
            raise InvalidParameterError("thinking", "a thinking budget is not supported with images")
        return await render_plan(served.tokenizer, served.context_length, "messages", messages,
                                 chat_tools(body), tool_choice=choice, parallel=parallel,
                                 thinking=_thinking(body), images=images,
                                 other_constraint=getattr(body, "structured_outputs", None) is not None)
    except InvalidParameterError as e:
        raise anthropic_param(e) from None


def _check_budget(body: MessagesRequest) -> None:
    thinking = body.thinking
    if thinking is None or thinking.type != "enabled":
        return
    if thinking.budget_tokens is None:
        raise InvalidParameterError("thinking.budget_tokens", "is required when thinking is enabled")
    if thinking.budget_tokens >= body.max_tokens:
        raise InvalidParameterError("thinking.budget_tokens", f"must be less than max_tokens ({body.max_tokens})")


def _params(body: MessagesRequest, plan: ChatPlan, d: SamplingDefaults) -> SamplingParams:
    """A field the request leaves out takes the model's default, else Anthropic's."""
    try:
        return SamplingParams(max_tokens=body.max_tokens,
                              temperature=d.get("temperature", 1.0) if body.temperature is None else body.temperature,
                              top_p=d.get("top_p", 1.0) if body.top_p is None else body.top_p,
                              top_k=d.get("top_k", 0) if body.top_k is None else body.top_k,
                              min_p=d.get("min_p", 0.0), repetition_penalty=d.get("repetition_penalty", 1.0),
                              stop=body.stop_sequences,
                              structured_outputs=plan.constraint_for(vllm_constraint(body.structured_outputs)),
                              skip_special_tokens=plan.skip_special_tokens)
    except InvalidParameterError as e:
        if e.param != "stop":
            raise
        raise InvalidParameterError("stop_sequences", e.message.removeprefix("stop: ")) from None


async def _respond(session: Session, body: MessagesRequest) -> Response:
    _check_budget(body)
    ids, plan = await _render(session, body)
    check_fits(len(ids), session.served.context_length, body.max_tokens, param="messages")
    steps = BudgetedReply(session, plan, _params(body, plan, session.served.sampling), thinking_budget(body))
    steps.start(ids)
    first = await steps.next()  # admission errors surface here, before any header is sent
    run = Run(session, body, plan, len(ids), steps)
    if body.stream:
        return stream_response(session, _events(run, first))
    async for _ in run.drive(first):
        pass
    await session.close(200)
    return JSONResponse(run.message(done=True))


def _event(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


async def _events(run: Run, item: tuple[int, RequestOutput] | None) -> AsyncIterator[bytes]:
    session = run.session
    try:
        if item is not None:
            run.cached = item[1].num_cached_tokens
        yield _event({"type": "message_start", "message": run.message(done=False)})
        yield _event({"type": "ping"})
        async for _ in run.drive(item):
            if run.out.events:
                yield b"".join(map(_event, run.out.events))
                run.out.events.clear()
        yield _event({"type": "message_delta", "delta": run.stop_fields(),
                      "usage": {"output_tokens": run.tokens}})
        yield _event({"type": "message_stop"})
        session.outcome = (200, None)
    except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band
        status = status_of(e)
        session.outcome = (status, str(e) or type(e).__name__)
        yield _event(error_body(status, e.message if isinstance(e, MLXRError) else "internal error"))
