"""The FastAPI application: middleware (auth, body limit, CORS), error mapping, routers."""
from __future__ import annotations

import asyncio
import contextlib
import hmac

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse

from mlxr.config import ServerConfig
from mlxr.errors import MLXRError
from mlxr.server.model_manager import ModelManager

OPEN_PATHS = frozenset({"/health"})


def error_response(path: str, status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    """OpenAI's error shape under /v1, Ollama's everywhere else."""
    if path.startswith("/v1"):
        body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    else:
        body = {"error": message}
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(body, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(MLXRError)
    async def _mlxr_error(request: Request, exc: MLXRError) -> JSONResponse:
        return error_response(request.url.path, exc.status, exc.message, exc.kind, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        field = ".".join(loc) or "body"
        msg = f"{field}: {first.get('msg', 'invalid request')}"
        return error_response(request.url.path, 400, msg, "invalid_request_error", field)


def install_guards(app: FastAPI, config: ServerConfig) -> None:
    keys = [k.encode() for k in config.api_keys]

    @app.middleware("http")
    async def _guard(request: Request, call_next):
        # The path the router will dispatch on, never a URL rebuilt from Host headers.
        path = request.scope["path"]
        if keys and path not in OPEN_PATHS and request.method != "OPTIONS":
            given = request.headers.get("authorization", "")
            token = given[7:].encode() if given.lower().startswith("bearer ") else b""
            if not any(hmac.compare_digest(token, k) for k in keys):
                return error_response(path, 401, "missing or invalid API key", "authentication_error")
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > config.max_body_bytes):
            return error_response(path, 413, f"request body over {config.max_body_bytes} bytes", "invalid_request_error")
        return await call_next(request)

    app.add_middleware(
        CORSMiddleware,
        allow_origin_regex=None if config.cors_origins else r"https?://(localhost|127\.0\.0\.1)(:\d+)?",
        allow_origins=list(config.cors_origins),
        allow_methods=["*"],
        allow_headers=["*"],
    )


def create_app(config: ServerConfig, registry) -> FastAPI:
    models = ModelManager(config, registry)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        reaper = asyncio.create_task(models.run_reaper())
        for name in config.preload:
            await models.acquire(name)
        try:
            yield
        finally:
            reaper.cancel()
            await models.shutdown()

    app = FastAPI(title="MLXR", version=_version(), lifespan=lifespan)
    app.state.config = config
    app.state.models = models
    app.state.registry = registry
    install_error_handlers(app)
    install_guards(app, config)

    @app.get("/health")
    async def health() -> JSONResponse:
        alive = all(m.engine.is_alive for m in models.served.values())
        return JSONResponse({"status": "ok" if alive else "degraded"}, status_code=200 if alive else 503)

    @app.get("/", response_class=PlainTextResponse)
    async def root() -> str:
        return "Ollama is running"

    return app


def _version() -> str:
    from mlxr import __version__

    return __version__
