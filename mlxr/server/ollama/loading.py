"""Finding and holding models for one Ollama request, on top of the shared server Session
(which counts the request as active, traces it for metrics and watches for disconnects)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from mlxr.errors import InvalidParameterError, ModelNotFoundError
from mlxr.server.model_manager import ServedModel
from mlxr.server.session import Session


@dataclass
class Hold:
    """A served model held by one request, with Ollama's keep_alive for after it."""

    request: Request
    session: Session
    keep_alive_s: float | None
    load_s: float  # time spent loading the model for this request (0 when it was loaded)
    ready_at: float  # time.perf_counter() when the model was ready

    @property
    def served(self) -> ServedModel:
        return self.session.served

    async def finish(self, status: int = 200) -> None:
        """End the session and restart the keep-alive timer from the end of the request, with
        the model's latest keep_alive (Ollama: the latest request's wins)."""
        await self.session.close(status)
        self.request.app.state.models.restart_keep_alive(self.served)

    async def unload_if_asked(self) -> None:
        """keep_alive 0: unload now, unless another request still uses the model (the reaper
        then unloads it when that one ends, unless it sets another keep_alive). The manager
        checks that under the model's lock, and unloads only the engine this request used."""
        if self.keep_alive_s == 0:
            await self.request.app.state.models.unload(self.served.name, self.served)


async def resolve(request: Request, name: str, field: str = "model") -> Any:
    """The registry record of `name`, with Ollama's 404 message for unknown models."""
    try:
        return await asyncio.to_thread(request.app.state.registry.resolve, name)
    except ModelNotFoundError:
        raise ModelNotFoundError(f"model '{name}' not found", param=field) from None
    except InvalidParameterError as e:
        raise InvalidParameterError(field, e.message.removeprefix(f"{e.param}: ")) from None


def model_of(request: Request, name: str) -> str:
    """The registry model a request for `name` runs: a LoRA adapter's base, else name itself."""
    adapter = request.app.state.models.adapters.get(name)
    return adapter.base if adapter is not None else name


async def hold(request: Request, name: str, route: str, keep_alive_s: float | None) -> Hold:
    """Load `name` if needed and hold it; end with `finish()` or `session.fail()`. A LoRA
    adapter's name holds its base (the session runs the adapter)."""
    if request.app.state.models.adapters.get(name) is None:
        await resolve(request, name)
    started, wall = time.perf_counter(), time.time()
    session = await Session.open(request, name, route, "ollama-")
    ready = time.perf_counter()
    request.app.state.models.touch(session.served, keep_alive_s)
    load_s = ready - started if session.served.loaded_at >= wall else 0.0
    return Hold(request, session, keep_alive_s, load_s, ready)
