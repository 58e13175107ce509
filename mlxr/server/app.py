"""The FastAPI application: middleware (auth, body limit, CORS), error mapping, routers."""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import re
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mlxr.config import ServerConfig
from mlxr.engine.core.core_attach import Attachment
from mlxr.errors import InvalidParameterError, MLXRError
from mlxr.server import admin, anthropic, log_tail, openai, tokenize_route, warm_requests, webui
from mlxr.server.access import LOOPBACK_ORIGIN_REGEX, AccessPolicy
from mlxr.server.anthropic.errors import error_body as anthropic_error, is_anthropic_path
from mlxr.server.guards import OPEN_PATHS, Guard  # noqa: F401 - OPEN_PATHS re-exported
from mlxr.server.internal_errors import InternalErrors
from mlxr.server.logs import ThroughputLogger, log_error_response
from mlxr.server.lora_table import ServedAdapter, check_adapter_name
from mlxr.server.metrics import ServerMetrics
from mlxr.server.model_manager import ModelManager, ServedModel
from mlxr.server.openapi_doc import install_openapi
from mlxr.server.reply_budget import DEFAULT_MAX_TOKENS
from mlxr.server.session import CLIENT_CLOSED, ClientDisconnected

# FastAPI >= 0.16x asks OpenTelemetry's global providers whether to trace on every request (an
# environment lookup each: 9.5% of the event loop's time admitting 256 requests at once); MLXR
# exports no OpenTelemetry data, so that check is turned off where the option exists.
_NO_OTEL = ({"telemetry": {"tracing": False, "metrics": False, "logs": False}}
            if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})

log = logging.getLogger(__name__)
Ready = Callable[[list[ServedModel]], None]
# How pydantic names a union member in an error's location: "str", "list[int]", ...
_UNION_MEMBER = re.compile(r"(str|int|float|bool)|\w+\[.*\]|function-\w+\[.*\]")


def error_response(path: str, status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    """Anthropic's shape on its routes, OpenAI's elsewhere under /v1, Ollama's everywhere else."""
    if is_anthropic_path(path):
        body = anthropic_error(status, message)
    elif path.startswith("/v1"):
        body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    else:
        body = {"error": message}
    headers = {"Retry-After": "1"} if status == 503 else None
    # Every error answer is made here (handlers, guards, 500s): one line each, so a 404 on an
    # unknown route or a body that fails validation is in the log too, not only the client's.
    log_error_response(path, status, message, param)
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str]:
    errors = exc.errors()
    # A union field reports one type mismatch per member it is not; the error of the member
    # the value was meant as (too long, out of range) says what to fix.
    first = next((e for e in errors if not str(e.get("type", "")).endswith("_type")), errors[0] if errors else {})
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _UNION_MEMBER.fullmatch(str(p))]
    if first.get("type") == "json_invalid":
        return "body", f"body: malformed JSON ({first.get('ctx', {}).get('error', 'invalid')})"
    field = ".".join(loc) or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return field, f"{field}: {first.get('msg', 'invalid request')}{more}"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(MLXRError)
    async def _mlxr_error(request: Request, exc: MLXRError) -> JSONResponse:
        return error_response(request.url.path, exc.status, exc.message, exc.kind, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        field, msg = _validation_message(exc)
        return error_response(request.url.path, 400, msg, "invalid_request_error", field)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(request.url.path, exc.status_code, str(exc.detail), kind)

    @app.exception_handler(ClientDisconnected)
    async def _gone(request: Request, exc: ClientDisconnected) -> JSONResponse:
        return error_response(request.url.path, CLIENT_CLOSED, "client disconnected", "client_closed")

    # Added first, so innermost of the middleware: the guards and CORS still see its 500s.
    app.add_middleware(InternalErrors, respond=error_response)


def install_guards(app: FastAPI, config: ServerConfig) -> None:
    access = AccessPolicy.build(config.host, config.allowed_hosts, config.cors_origins)
    # Added last = outermost: CORS answers preflights and decorates the guard's 401s too.
    app.add_middleware(Guard, api_keys=config.api_keys, max_body_bytes=config.max_body_bytes,
                       respond=error_response, access=access, max_blob_bytes=config.max_blob_bytes)
    app.add_middleware(
        CORSMiddleware,
        allow_origin_regex=LOOPBACK_ORIGIN_REGEX,
        allow_origins=sorted(access.origins),
        allow_methods=["*"],
        allow_headers=["*"],
    )


def create_app(config: ServerConfig, registry, stats_every_s: float = 5.0,
               attached: dict[str, Attachment] | None = None, api_server_index: int = 0,
               max_tokens_default: int = DEFAULT_MAX_TOKENS, ready: Ready | None = None) -> FastAPI:
    """attached: the engine cores' channels of this API process under a supervisor
    (`--api-servers N`); None: the process loads its models itself. max_tokens_default: a
    reply's bound where the request sets none (reply_budget.py). ready: called with the
    preloaded models once they are loaded and warm (the start-up banner)."""
    models = ModelManager(config, registry, attached)
    tail = log_tail.LogTail()
    snapshot = lambda: admin.engine_snapshot(models)  # noqa: E731

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        tasks = [asyncio.create_task(models.run_reaper())]
        tail.attach()
        _import_stream_backend()
        served = [await models.acquire(name) for name in config.preload]
        await warm_requests.warm_up(app, served)
        if ready is not None:
            ready(served)
        # After the warm-up: its requests are not the users' throughput (and the counters it
        # leaves behind start over).
        tasks.append(asyncio.create_task(ThroughputLogger(snapshot, stats_every_s).run()))
        try:
            yield
        finally:
            tail.detach()
            for t in tasks:
                t.cancel()
            await models.shutdown()

    app = FastAPI(title="MLXR", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None,
                  **_NO_OTEL)
    app.state.config = config
    app.state.max_tokens_default = max_tokens_default
    app.state.log_tail = tail
    app.state.models = models
    app.state.registry = registry
    app.state.metrics = ServerMetrics(snapshot, api_server=(api_server_index, config.api_servers),
                                      engine=config.engine, dtype=config.dtype)
    app.state.default_model = config.preload[0] if config.preload else None
    add_start_adapters(models, config, app.state.default_model)
    app.state.api_server = {"index": api_server_index, "count": config.api_servers, "pid": os.getpid()}
    warm_requests.install(app)
    install_error_handlers(app)
    install_guards(app, config)
    install_openapi(app, secured=bool(config.api_keys))
    app.add_middleware(webui.WebUI)  # outermost: the page loads before it can ask for a key
    _add_routes(app, models)
    webui.add_docs(app)
    return app


def _add_routes(app: FastAPI, models: ModelManager) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        alive = models.healthy()
        body = {"status": "ok" if alive else "degraded"}
        if models.config.engine.data_parallel_size > 1:  # each replica's state (stats wait for a step)
            body["replicas"] = await asyncio.to_thread(admin.replica_health, models)
        return JSONResponse(body, status_code=200 if alive else 503)

    @app.get("/", response_class=PlainTextResponse)
    async def root() -> str:
        return "Ollama is running"

    app.include_router(openai.router)
    app.include_router(anthropic.router)
    app.include_router(admin.router)
    app.include_router(log_tail.router)
    app.include_router(tokenize_route.router)
    ollama = _ollama_router()
    if ollama is not None:
        app.include_router(ollama)


def add_start_adapters(models: ModelManager, config: ServerConfig, default: str | None) -> None:
    """--lora NAME=PATH: adapters of the default model, loaded with it."""
    if config.engine.lora_modules and default is None:
        raise InvalidParameterError("lora", "--lora needs a model to adapt: name one with --model")
    for name, path in config.engine.lora_modules:
        models.adapters.add(ServedAdapter(check_adapter_name(name), models.canonical(default), path))


def _ollama_router():
    import mlxr.server.ollama as ollama  # written alongside; absent router = not mounted yet

    return getattr(ollama, "router", None)


def _import_stream_backend() -> None:
    """Starlette's first streamed response imports anyio's backend for this event loop: ~20 ms
    that a restarted server's first request would otherwise wait for. (anyio keeps the call
    in a private module: another anyio only loses the head start.)"""
    try:
        from anyio._core._eventloop import get_async_backend

        get_async_backend()
    except Exception as e:  # noqa: BLE001 - an optimisation, never a reason not to start
        log.debug("anyio's backend not imported ahead: %s", e)


def _version() -> str:
    from mlxr import __version__

    return __version__
