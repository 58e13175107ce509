"""The browser UI: the built single-page app under /ui/, the browser redirect from /, and
offline /docs (Swagger UI's assets from the fastapi-offline package, not a CDN).

Served by an ASGI middleware in front of the API key guard: the page has to load before it
can ask for the key. It serves only files shipped in the package; every API call the page
makes goes through the guard as usual."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse, RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxr.server.logs import log_error_response

STATIC_DIR = Path(__file__).parent / "static"
UI_PREFIX = "/ui"
DOCS_ASSETS = "/docs-assets"
REDOC_JS = DOCS_ASSETS + "/redoc-offline.js"
# Same-origin only: no inline script, no remote script, style or connection.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
       "frame-ancestors 'none'; form-action 'none'")
UI_HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
              (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY")]


def _swagger_dir() -> Path | None:
    try:
        import fastapi_offline
    except ImportError:
        return None
    return Path(fastapi_offline.__file__).parent / "static"


class WebUI:
    """Answers /ui/*, /docs-assets/*, HEAD / and a browser's GET /; passes everything else on."""

    def __init__(self, app: ASGIApp, static_dir: Path = STATIC_DIR) -> None:
        self.app = app
        self.ui = StaticFiles(directory=static_dir, html=True, check_dir=False)
        swagger = _swagger_dir()
        self.docs = StaticFiles(directory=swagger, check_dir=False) if swagger else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        if path == "/" and method == "HEAD":
            await PlainTextResponse("")(scope, receive, send)
        elif path == "/" and method == "GET" and _wants_html(scope):
            await RedirectResponse(UI_PREFIX + "/", status_code=307)(scope, receive, send)
        elif path == UI_PREFIX:
            await RedirectResponse(UI_PREFIX + "/", status_code=307)(scope, receive, send)
        elif path.startswith(UI_PREFIX + "/"):
            await _files(self.ui, _strip(scope, UI_PREFIX), receive, _with_headers(send, UI_HEADERS), path)
        elif path == REDOC_JS and method == "GET" and self.docs is not None:
            await Response(_offline_redoc(self.docs.directory), media_type="text/javascript")(scope, receive, send)
        elif path.startswith(DOCS_ASSETS + "/") and self.docs is not None:
            await _files(self.docs, _strip(scope, DOCS_ASSETS), receive, send, path)
        else:
            await self.app(scope, receive, send)


async def _files(files: StaticFiles, scope: Scope, receive: Receive, send: Send, route: str) -> None:
    """StaticFiles raises its 404 and 405; out here no exception handler would turn them
    into answers."""
    try:
        await files(scope, receive, send)
    except HTTPException as e:
        log_error_response(route, e.status_code, str(e.detail))
        await PlainTextResponse(str(e.detail), status_code=e.status_code, headers=e.headers)(scope, receive, send)


def _wants_html(scope: Scope) -> bool:
    return "text/html" in Headers(scope=scope).get("accept", "")


def _strip(scope: Scope, prefix: str) -> Scope:
    return {**scope, "path": scope["path"][len(prefix):], "raw_path": scope["path"][len(prefix):].encode()}


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return wrapped


def add_docs(app: FastAPI) -> None:
    """/docs and /redoc from local assets: create the app with docs_url=None and
    redoc_url=None, then call this."""

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png")

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - API",
                              redoc_js_url=REDOC_JS,
                              redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png", with_google_fonts=False)


_REDOC_CDN_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
_redoc_js: bytes | None = None


def _offline_redoc(folder) -> bytes:
    """ReDoc's bundle with its footer logo (always fetched from Redocly's CDN) pointed at a local
    image, so /redoc makes no request off this machine."""
    global _redoc_js
    if _redoc_js is None:
        text = (Path(folder) / "redoc.standalone.js").read_bytes()
        _redoc_js = text.replace(_REDOC_CDN_LOGO.encode(), f"{DOCS_ASSETS}/favicon.png".encode())
    return _redoc_js
