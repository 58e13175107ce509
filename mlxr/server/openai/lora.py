"""vLLM's runtime LoRA routes: POST /v1/load_lora_adapter {lora_name, lora_path} and
/v1/unload_lora_adapter {lora_name}, on a server started with --enable-lora (or --lora). An
adapter goes on the server's default model, or on the one the body's `model` names; requests
already running are not touched (docs/lora.md)."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from mlxr.errors import AdapterError, InvalidParameterError, ModelNotFoundError
from mlxr.server.lora_table import MAX_PATH_CHARS, ServedAdapter, check_adapter_name
from mlxr.server.session import default_model

router = APIRouter()


async def _body(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise InvalidParameterError("body", "must be a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidParameterError("body", "must be a JSON object")
    return body


def _check_enabled(request: Request) -> None:
    engine = request.app.state.config.engine
    if not (engine.enable_lora or engine.lora_modules):
        raise InvalidParameterError("lora_name", "this server serves no LoRA adapters: start it with --enable-lora")


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request) -> PlainTextResponse:
    _check_enabled(request)
    body = await _body(request)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not name or not path:
        raise InvalidParameterError("lora_name", "Both 'lora_name' and 'lora_path' must be provided.")
    check_adapter_name(name)
    if not isinstance(path, str) or len(path) > MAX_PATH_CHARS or "\0" in path:
        raise InvalidParameterError("lora_path", f"must be a path of at most {MAX_PATH_CHARS} characters, without NUL")
    models = request.app.state.models
    if models.adapters.get(name) is not None:
        raise AdapterError(f"The lora adapter '{name}' has already been loaded.")
    base_name = body.get("model") or default_model(request)
    if await asyncio.to_thread(_is_registry_model, request, name):
        raise InvalidParameterError("lora_name", f"{name!r} is a model's name already")
    served = await models.acquire(base_name, hold=True)
    try:
        await served.engine.lora("load", name, path)
        models.adapters.add(ServedAdapter(name, served.name, path))
    finally:
        models.release(served)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> PlainTextResponse:
    _check_enabled(request)
    body = await _body(request)
    name = body.get("lora_name")
    if not name:
        raise InvalidParameterError("lora_name", "'lora_name' must be provided.")
    models = request.app.state.models
    adapter = models.adapters.get(name) if isinstance(name, str) else None
    if adapter is None:
        raise ModelNotFoundError(f"The lora adapter '{name}' cannot be found.")
    models.adapters.remove(name)
    served = models.get_loaded(adapter.base)
    if served is not None:  # else the base loads without it next time
        await served.engine.lora("unload", name)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def _is_registry_model(request: Request, name: str) -> bool:
    try:
        request.app.state.registry.resolve(name)
    except ModelNotFoundError:
        return False
    except Exception:  # noqa: BLE001 - a name the registry cannot even parse is no model's
        return False
    return True


def adapter_cards(request: Request) -> list[dict]:
    """/v1/models entries of the adapters (vLLM's: root the file, parent the base model)."""
    return [{"id": a.name, "object": "model", "created": 0, "owned_by": "mlxr", "root": a.path, "parent": a.base}
            for a in request.app.state.models.adapters.adapters.values()]
