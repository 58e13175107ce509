"""Ollama's generation routes: /api/generate, /api/chat, /api/embed, /api/embeddings and
/api/version. Model management routes live in model_routes and are included here.

`format` ("json" or a schema) constrains decoding (structured.py). A prompt over num_ctx is cut
to fit (truncation.py) unless `truncate: false`.
Tools are rendered and calls read back as in server/chat_plan.py and reply_parser.py;
/api/chat's `think` works where the template thinks (chat_plan).
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from mlxr.engine.encoder.encoder_engine import EncoderEngine
from mlxr.errors import InvalidParameterError
from mlxr.model_config import VisionArgs
from mlxr.server.chat_plan import check_forced_calls
from mlxr.server.ollama import generation, modelfile
from mlxr.server.ollama.durations import ns, parse_keep_alive, rfc3339
from mlxr.server.ollama.generation import Job
from mlxr.server.ollama.loading import Hold, hold, model_of, resolve
from mlxr.server.ollama.model_routes import router as model_router
from mlxr.server.ollama.prompts import chat_plan
from mlxr.server.ollama.options import (
    Options, context_window, log_ignored, max_tokens, num_threads, sampling_params,
)
from mlxr.server.ollama.prompts import chat_images, generate_prompt_ids, planned_ids
from mlxr.server.ollama.structured import structured_outputs
from mlxr.server.reasoning_budget import effort_budget
from mlxr.server.ollama.schemas import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest
from mlxr.server.ollama.truncation import fit_chat, fit_prompt
from mlxr.server.prompt_work import check_prompt_chars, max_prompt_chars, off_loop
from mlxr.server.reply_budget import default_max_tokens
from mlxr.types import ImagePromptIds

log = logging.getLogger(__name__)
router = APIRouter(tags=["ollama"])
MAX_TOP_LOGPROBS = 20  # Ollama's limit
router.include_router(model_router)


@router.get("/api/version")
async def version() -> dict[str, str]:
    from mlxr import __version__

    return {"version": __version__}


def _logprobs(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """Top alternatives per token (0 = the chosen token only), or None: no logprobs."""
    if top_logprobs is not None and not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidParameterError("top_logprobs", f"must be between 0 and {MAX_TOP_LOGPROBS}, got {top_logprobs}")
    if top_logprobs and not logprobs:
        raise InvalidParameterError("top_logprobs", "requires logprobs: true")
    return (top_logprobs or 0) if logprobs else None


@router.post("/api/generate")
async def generate(body: GenerateRequest, request: Request) -> Response:
    arrival = time.perf_counter()
    _check_extras(body.format, body.think, body.options)
    top_n = _logprobs(body.logprobs, body.top_logprobs)
    body = modelfile.for_generate(body, (await resolve(request, model_of(request, body.model))).settings)
    held = await hold(request, body.model, "/api/generate", parse_keep_alive(body.keep_alive))
    await _use_threads(held, body.options)
    if not body.prompt:
        return await _load_only(held, body.model, {"response": ""})
    fit = None if body.truncate is False else lambda tok, ids, window: fit_prompt(ids, body.options, window)
    vision = held.served.args.vision
    return await _start(held, body, arrival, chat=False,
                        ids=lambda tok: generate_prompt_ids(body, tok, held.served.context_length, vision),
                        fit=fit, top_n=top_n)


@router.post("/api/chat")
async def chat(body: ChatRequest, request: Request) -> Response:
    arrival = time.perf_counter()
    _check_extras(body.format, None, body.options)  # `think` is checked against the template
    top_n = _logprobs(body.logprobs, body.top_logprobs)
    body = modelfile.for_chat(body, (await resolve(request, model_of(request, body.model))).settings)
    held = await hold(request, body.model, "/api/chat", parse_keep_alive(body.keep_alive))
    await _use_threads(held, body.options)
    if not body.messages:
        return await _load_only(held, body.model, {"message": {"role": "assistant", "content": ""}})
    fit = None if body.truncate is False else lambda tok, ids, window: fit_chat(body, tok, body.options, window,
                                                                                   held.served.context_length)
    planned = _Planned(body, held.served.context_length, held.served.args.vision)
    return await _start(held, body, arrival, chat=True, ids=planned.ids, fit=fit, top_n=top_n, planned=planned)


class _Planned:
    """Renders a chat prompt and keeps its plan (tools, thinking) to read the reply with."""

    def __init__(self, body: ChatRequest, context_length: int, vision: VisionArgs | None = None) -> None:
        self.body, self.plan, self.context_length, self.vision = body, None, context_length, vision

    def ids(self, tokenizer: Any) -> list[int]:
        images = chat_images(self.body, self.vision)
        self.plan = chat_plan(self.body, tokenizer, self.vision)
        return planned_ids(self.plan, tokenizer, self.context_length, images, self.vision)


# (tokenizer, prompt ids, window) -> prompt ids that fit the window
Fit = Callable[[Any, list[int], int], list[int]]


async def _start(held: Hold, body: GenerateRequest | ChatRequest, arrival: float, *, chat: bool,
                 ids: Callable[[Any], list[int]], fit: Fit | None, top_n: int | None,
                 planned: _Planned | None = None) -> Response:
    try:
        tokenizer = held.served.tokenizer
        prompt_ids = await off_loop(ids, tokenizer)
        window = context_window(body.options, held.served.context_length)
        truncated_from = None
        # A prompt with images is never cut (its image tokens must stay whole): too long, it is refused.
        if fit is not None and len(prompt_ids) >= window and not isinstance(prompt_ids, ImagePromptIds):
            truncated_from = len(prompt_ids)
            prompt_ids = await off_loop(fit, tokenizer, prompt_ids, window)
        budget = max_tokens(body.options, len(prompt_ids), window, "messages" if chat else "prompt",
                            default_max_tokens(held.request))
        held.session.trace.prompt_tokens = len(prompt_ids)
        constraint = structured_outputs(body.format, body.structured_outputs)
        if planned is not None and planned.plan is not None:  # a chat reply may reason first
            await check_forced_calls(planned.plan)
            constraint = planned.plan.constraint_for(constraint)
        params = replace(sampling_params(body.options, budget, held.served.sampling), logprobs=top_n,
                         structured_outputs=constraint,
                         skip_special_tokens=planned is None or planned.plan is None or planned.plan.skip_special_tokens)
        job = Job(held, body.model, prompt_ids, params, chat, arrival, top_n, truncated_from=truncated_from)
        job.plan = planned.plan if planned else None
        job.think_budget = effort_budget(getattr(body, "think", None)) if chat else None
        return await generation.run(job, body.stream)
    except BaseException as e:
        await held.session.fail(e)
        raise


async def _load_only(held: Hold, model: str, empty: dict[str, Any]) -> JSONResponse:
    """An empty prompt only loads the model (or unloads it with keep_alive 0)."""
    await held.finish()
    await held.unload_if_asked()
    reason = "unload" if held.keep_alive_s == 0 else "load"
    return JSONResponse({"model": model, "created_at": rfc3339(), **empty, "done": True, "done_reason": reason})


async def _use_threads(held: Hold, options: Options | None) -> None:
    """num_thread, as Ollama applies it to the runner: the loaded model's CPU threads from this
    request on; a request without it restores the load-time default."""
    try:
        applied = await held.served.engine.use_cpu_threads(num_threads(options))
    except BaseException as e:
        await held.session.fail(e)
        raise
    if not applied and options is not None and options.num_thread:
        log.info("ollama option num_thread=%d ignored: the model does not run on this process's CPU",
                 options.num_thread)


def _check_extras(fmt: Any, think: Any, options: Options | None) -> None:
    num_threads(options)  # a bad value is a 400 before the model loads
    if think not in (None, False, "", "false"):
        raise InvalidParameterError("think", "the served models do not support thinking")
    log_ignored(options)


@router.post("/api/embed")
async def embed(body: EmbedRequest, request: Request) -> JSONResponse:
    """An input longer than the context is cut to fit (logged), as Ollama does by default;
    truncate=false makes it a 400."""
    arrival = time.perf_counter()
    log_ignored(body.options)
    inputs = [body.input] if isinstance(body.input, str) else body.input
    inputs = [] if inputs == [""] else inputs
    held = await hold(request, body.model, "/api/embed", parse_keep_alive(body.keep_alive))
    vectors, count = [], 0
    try:
        if isinstance(held.served.engine, EncoderEngine):
            vectors, count = await _embed_encoder(held, inputs, body.truncate is not False, body.dimensions)
        for i, text in enumerate(inputs if not vectors else []):
            vector, n = await _embed_one(held, text, body.truncate is not False, f"input.{i}")
            vectors.append(_shorten(vector, body.dimensions))
            count += n
    except BaseException as e:
        await held.session.fail(e)
        raise
    held.session.trace.prompt_tokens = count
    await held.finish()
    await held.unload_if_asked()
    return JSONResponse({"model": body.model, "embeddings": vectors, "total_duration": ns(time.perf_counter() - arrival),
                         "load_duration": ns(held.load_s), "prompt_eval_count": count})


@router.post("/api/embeddings")
async def embeddings(body: EmbeddingsRequest, request: Request) -> JSONResponse:
    """The legacy single-prompt form: {"embedding": [...]}."""
    log_ignored(body.options)
    held = await hold(request, body.model, "/api/embeddings", parse_keep_alive(body.keep_alive))
    try:
        vector = (await _embed_one(held, body.prompt, False, "prompt"))[0] if body.prompt else []
    except BaseException as e:
        await held.session.fail(e)
        raise
    await held.finish()
    await held.unload_if_asked()
    return JSONResponse({"embedding": vector})


async def _embed_one(held: Hold, text: str, truncate: bool, field: str) -> tuple[list[float], int]:
    served = held.served
    ids = await off_loop(_embedding_ids, served.tokenizer, served.context_length, text, truncate, field)
    try:
        return await served.engine.embed(ids)
    except InvalidParameterError as e:
        raise InvalidParameterError(field, e.message.removeprefix(f"{e.param}: ")) from None


async def _embed_encoder(held: Hold, texts: list[str], truncate: bool,
                         dimensions: int | None) -> tuple[list[list[float]], int]:
    """An encoder's inputs in one batched call; dimensions keep the first N values, normalised."""
    served = held.served
    ids = [await off_loop(_embedding_ids, served.tokenizer, served.context_length, t, truncate, f"input.{i}")
           for i, t in enumerate(texts)]
    vectors = await served.engine.embed_many(ids, normalize=True if dimensions else None, dimensions=dimensions)
    return vectors, sum(map(len, ids))


def _embedding_ids(tokenizer: Any, context_length: int, text: str, truncate: bool, field: str) -> list[int]:
    """Tokenized here, in the prompt pool: on the engine thread it would stall every stream."""
    limit = max_prompt_chars(tokenizer, context_length)
    if not truncate:
        check_prompt_chars(tokenizer, context_length, text, field)
    ids = tokenizer.encode(text[:limit])  # the first context_length tokens come from these
    if truncate and len(ids) > context_length:
        log.info("embedding input of %d tokens truncated to the context length %d", len(ids), context_length)
    return ids[:context_length] if truncate else ids


def _shorten(vector: list[float], dimensions: int | None) -> list[float]:
    """Ollama's `dimensions`: keep the first N values and re-normalise."""
    if dimensions is None:
        return vector
    if dimensions > len(vector):
        raise InvalidParameterError("dimensions", f"must be at most {len(vector)}, got {dimensions}")
    head = vector[:dimensions]
    norm = math.sqrt(sum(v * v for v in head)) or 1.0
    return [v / norm for v in head]
