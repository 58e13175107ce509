"""GET /v1/models, GET /v1/models/{id}, POST /v1/embeddings."""
from __future__ import annotations

import asyncio
import base64
from datetime import datetime

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from mlxr.engine.encoder.encoder_engine import EncoderEngine
from mlxr.errors import ContextLengthError, InvalidParameterError
from mlxr.loader.hf_model import read_config
from mlxr.models import ENCODERS, VISION_ARCHS
from mlxr.server.openai.lora import adapter_cards
from mlxr.server.openai.prompts import encode_inputs
from mlxr.server.openai.schemas import MAX_EMBEDDING_TOKENS, EmbeddingRequest
from mlxr.server.prompt_work import off_loop
from mlxr.server.session import Session

router = APIRouter()


def _epoch(stamp: object) -> int:
    if isinstance(stamp, (int, float)):
        return int(stamp)
    try:
        return int(datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0


def model_card(record, served=None) -> dict:
    """A loaded model reports the context its engine runs (the KV cache may cap the file's)."""
    context = served.context_length if served is not None else record.context_length
    card = {"id": record.name, "object": "model", "created": _epoch(record.created_at),
            "owned_by": "mlxr", "max_model_len": context}
    if record.architecture in ENCODERS:  # embedding and reranking models say so; the rest generate
        reranker = served is not None and getattr(served.engine, "is_reranker", False)
        card["capabilities"] = ["rerank"] if reranker else ["embedding"]
    elif takes_images(record, served):
        card["capabilities"] = ["completion", "vision"]
    return card


def takes_images(record, served=None) -> bool:
    """A loaded model's tower, an mmproj beside a GGUF, or an HF directory whose config.json has
    a vision_config (of an architecture MLXR runs with images)."""
    if served is not None and getattr(served, "args", None) is not None:
        return served.args.vision is not None
    if getattr(record, "projector", None) is not None:
        return True
    if record.format != "safetensors" or record.architecture not in VISION_ARCHS:
        return False
    try:
        return isinstance(read_config(record.path).get("vision_config"), dict)
    except Exception:  # noqa: BLE001 - an unreadable directory is the loader's error to name
        return False


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    records = await asyncio.to_thread(request.app.state.registry.list)
    served = request.app.state.models.served
    cards = [model_card(r, served.get(r.name)) for r in records] + adapter_cards(request)
    return JSONResponse({"object": "list", "data": cards})


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> JSONResponse:
    adapter = [c for c in adapter_cards(request) if c["id"] == model_id]
    if adapter:
        return JSONResponse(adapter[0])
    record = await asyncio.to_thread(request.app.state.registry.resolve, model_id)
    return JSONResponse(model_card(record, request.app.state.models.served.get(record.name)))


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request) -> JSONResponse:
    session = await Session.open(request, body.model, "/v1/embeddings", "embd-")
    try:
        data, tokens = await _embed_all(session, body)
    except BaseException as e:
        await session.fail(e)
        raise
    await session.close(200)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return JSONResponse({"object": "list", "data": data, "model": session.model, "usage": usage})


async def _embed_all(session: Session, body: EmbeddingRequest) -> tuple[list[dict], int]:
    served = session.served
    inputs = await off_loop(encode_inputs, served.tokenizer, body.input, "input", served.context_length)
    for ids in inputs:
        if len(ids) > served.context_length:
            raise ContextLengthError(len(ids), served.context_length, param="input")
    session.trace.prompt_tokens = sum(len(i) for i in inputs)
    if session.trace.prompt_tokens > MAX_EMBEDDING_TOKENS:
        raise InvalidParameterError("input", f"{session.trace.prompt_tokens} tokens in one request; at most "
                                             f"{MAX_EMBEDDING_TOKENS} (split the inputs over several requests)")
    if isinstance(served.engine, EncoderEngine):  # one batched call; dimensions: Matryoshka truncation
        vectors = await served.engine.embed_many(inputs, body.pooling, body.normalize, body.dimensions)
        data = [{"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
                for i, v in enumerate(vectors)]
        return data, session.trace.prompt_tokens
    for name in ("pooling", "normalize"):
        if getattr(body, name) is not None:
            raise InvalidParameterError(name, "applies to encoder models only; a decoder pools as its files say")
    data, total = [], 0
    for index, ids in enumerate(inputs):
        vector, count = await served.engine.embed(ids)
        if body.dimensions is not None and body.dimensions != len(vector):
            raise InvalidParameterError("dimensions", f"this model's embeddings have {len(vector)} dimensions")
        data.append({"object": "embedding", "index": index, "embedding": _encode(vector, body.encoding_format)})
        total += count
    return data, total


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector
