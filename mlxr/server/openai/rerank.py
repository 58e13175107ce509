"""Reranking: POST /v1/rerank, /rerank and /v2/rerank in the Cohere / Jina shape, and vLLM's
/score and /v1/score. A cross-encoder's pairs are tokenized as its tokenizer pairs texts and
scored in one batched call (EncoderEngine.score); a decoder reranker (Qwen3-Reranker) answers
yes or no after its prompt, each pair a prompt-logprob call on the paged engine."""
from __future__ import annotations

import math
import time
import uuid
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from mlxr.engine.encoder.encoder_engine import EncoderEngine
from mlxr.engine.encoder.runner import EncoderInput
from mlxr.errors import ContextLengthError, InvalidParameterError
from mlxr.models.qwen3_reranker import KIND as QWEN3_RERANKER
from mlxr.models.qwen3_reranker import rerank_prompt
from mlxr.server.openai.schemas import _Body
from mlxr.server.prompt_work import off_loop
from mlxr.server.session import Session

router = APIRouter()
MAX_RERANK_DOCUMENTS = 1000  # documents (or text_2 entries) in one request
MAX_DOCUMENT_CHARS = 100_000  # characters of one document, and of the query

Text = Annotated[str, Field(max_length=MAX_DOCUMENT_CHARS)]


class Document(_Body):
    text: Text


class RerankRequest(_Body):
    model: str | None = Field(None, max_length=512)
    query: Text
    documents: Annotated[list[Text | Document], Field(max_length=MAX_RERANK_DOCUMENTS)]
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = True


class ScoreRequest(_Body):
    model: str | None = Field(None, max_length=512)
    text_1: Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_RERANK_DOCUMENTS)]
    text_2: Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_RERANK_DOCUMENTS)]


@router.post("/v1/rerank")
@router.post("/v2/rerank")
@router.post("/rerank")
async def rerank(body: RerankRequest, request: Request) -> JSONResponse:
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    session = await Session.open(request, body.model, "/v1/rerank", "rerank-")
    try:
        scores, tokens = await _scores(session, [(body.query, t) for t in texts], "documents")
    except BaseException as e:
        await session.fail(e)
        raise
    await session.close(200)
    order = sorted(range(len(texts)), key=lambda i: -scores[i])[: body.top_n]
    results = [{"index": i, "relevance_score": scores[i], **({"document": {"text": texts[i]}} if body.return_documents
                                                               else {})} for i in order]
    return JSONResponse({"id": session.request_id, "model": session.model, "results": results,
                         "usage": {"total_tokens": tokens}, "meta": {"billed_units": {"search_units": 1}}})


@router.post("/v1/score")
@router.post("/score")
async def score(body: ScoreRequest, request: Request) -> JSONResponse:
    pairs = _score_pairs(body.text_1, body.text_2)
    session = await Session.open(request, body.model, "/v1/score", "score-")
    try:
        scores, tokens = await _scores(session, pairs, "text_2")
    except BaseException as e:
        await session.fail(e)
        raise
    await session.close(200)
    data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
    return JSONResponse({"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                         "model": session.model, "data": data,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def _score_pairs(first: str | list[str], second: str | list[str]) -> list[tuple[str, str]]:
    """vLLM's pairing: one text_1 against each text_2, or text_1[i] with text_2[i]."""
    firsts = [first] if isinstance(first, str) else first
    seconds = [second] if isinstance(second, str) else second
    if len(firsts) == 1:
        return [(firsts[0], s) for s in seconds]
    if len(firsts) != len(seconds):
        raise InvalidParameterError("text_2", f"has {len(seconds)} entries; text_1 has {len(firsts)} (one, or as many)")
    return list(zip(firsts, seconds))


async def _scores(session: Session, pairs: list[tuple[str, str]], field: str) -> tuple[list[float], int]:
    engine = session.served.engine
    if session.served.args.extra.get("reranker") == QWEN3_RERANKER:
        return await _yes_no_scores(session, pairs, field)
    if not isinstance(engine, EncoderEngine) or not engine.is_reranker:
        raise InvalidParameterError("model", f"{session.model} is not a reranker: scoring needs a cross-encoder "
                                             "(a BERT or XLM-RoBERTa sequence-classification model)")
    if not pairs:
        return [], 0
    inputs = await off_loop(_encode_pairs, session.served.tokenizer, pairs, session.served.context_length, field)
    session.trace.prompt_tokens = sum(len(x.ids) for x in inputs)
    return await session.watched(engine.score(inputs)), session.trace.prompt_tokens


async def _yes_no_scores(session: Session, pairs: list[tuple[str, str]], field: str) -> tuple[list[float], int]:
    """A decoder reranker: softmax over the "no" and "yes" logits after the model's prompt (the
    two logprobs share the log-softmax's normaliser, which cancels)."""
    served = session.served
    answers = [served.tokenizer.token_to_id(t) for t in ("yes", "no")]
    if None in answers:
        raise InvalidParameterError("model", f"{session.model}'s vocabulary lacks the yes / no answer tokens")
    prompts = await off_loop(_encode_prompts, served.tokenizer, pairs, served.context_length - 1, field)
    session.trace.prompt_tokens = sum(map(len, prompts))
    scores = []
    for ids in prompts:
        yes, no = [await session.watched(served.engine.last_token_logprob(ids + [a])) for a in answers]
        scores.append(1 / (1 + math.exp(no - yes)))
    return scores, session.trace.prompt_tokens


def _encode_prompts(tokenizer, pairs: list[tuple[str, str]], context: int, field: str) -> list[list[int]]:
    out = []
    for i, (query, document) in enumerate(pairs):
        ids = tokenizer.encode(rerank_prompt(query, document))
        if len(ids) > context:
            raise ContextLengthError(len(ids), context, param=f"{field}.{i}")
        out.append(ids)
    return out


def _encode_pairs(tokenizer, pairs: list[tuple[str, str]], context: int, field: str) -> list[EncoderInput]:
    out = []
    for i, (first, second) in enumerate(pairs):
        ids, types = tokenizer.encode_pair(first, second)
        if len(ids) > context:
            raise ContextLengthError(len(ids), context, param=f"{field}.{i}")
        out.append(EncoderInput(ids, types))
    return out
