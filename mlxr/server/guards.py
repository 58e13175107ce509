"""ASGI middleware in front of every route: Host and Origin (access.py), API key, body
content type and size.

Pure ASGI rather than BaseHTTPMiddleware so streamed responses and client disconnects pass
through untouched."""
from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxr.server.access import AccessPolicy

OPEN_PATHS = frozenset({"/health"})
BLOB_PREFIX = "/api/blobs/"  # raw model bytes, bounded by max_blob_bytes instead
_BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_CURL_FORM = "application/x-www-form-urlencoded"


def is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def body_type_problem(scope: Scope, headers: Headers) -> str | None:
    """Why this request's body may not be read as JSON (None: it may). A browser can send
    text/plain and form bodies cross-site without a preflight, so only JSON is taken."""
    if scope["method"] in _BODYLESS_METHODS or not _has_body(headers):
        return None
    content_type = headers.get("content-type", "")
    if is_json_type(content_type):
        return None
    # Ollama's documented `curl URL -d '{json}'` sends a form type. Browsers always send
    # Origin with a POST, so a form body without one is not a cross-site request.
    curl = content_type.split(";", 1)[0].strip().lower() in ("", _CURL_FORM)
    if curl and scope["path"].startswith("/api/") and "origin" not in headers:
        return None
    return f"request bodies must be application/json, got {content_type or 'no content type'!r}"


def _has_body(headers: Headers) -> bool:
    return headers.get("content-length", "0") != "0" or "transfer-encoding" in headers


def as_json_body(scope: Scope) -> Scope:
    """The curl form above, relabelled so the route parses it as JSON, as Ollama does."""
    if not scope["path"].startswith("/api/"):
        return scope
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


class Guard:
    def __init__(self, app: ASGIApp, api_keys: tuple[str, ...], max_body_bytes: int, respond,
                 access: AccessPolicy | None = None, max_blob_bytes: int = 0) -> None:
        # respond(path, status, message, kind) -> an ASGI response in the route family's shape.
        self.app = app
        self.keys = [k.encode() for k in api_keys]
        self.max_body = max_body_bytes
        self.max_blob = max_blob_bytes
        self.respond = respond
        self.access = access or AccessPolicy.build("127.0.0.1", (), ())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # The path the router will dispatch on; never a URL rebuilt from Host headers.
        path = scope["path"]
        headers = Headers(scope=scope)
        refusal = self._refusal(headers)
        if refusal is not None:
            await self.respond(path, *refusal)(scope, receive, send)
            return
        if self.keys and path not in OPEN_PATHS and not self._authorized(headers):
            await self.respond(path, 401, "missing or invalid API key", "authentication_error")(scope, receive, send)
            return
        blob = path.startswith(BLOB_PREFIX)
        limit = self.max_blob if blob else self.max_body
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            msg = f"request body over {limit} bytes"
            await self.respond(path, 413, msg, "invalid_request_error")(scope, receive, send)
            return
        if blob:
            await self.app(scope, self._limited(receive, limit), send)
            return
        problem = body_type_problem(scope, headers)
        if problem is not None:
            await self.respond(path, 415, problem, "invalid_request_error")(scope, receive, send)
            return
        await self.app(as_json_body(scope), self._limited(receive, limit), send)

    def _refusal(self, headers: Headers) -> tuple[int, str, str] | None:
        host = headers.get("host")
        if not self.access.host_allowed(host):
            return 403, f"Host {host!r} is not allowed (see --allowed-host)", "permission_error"
        origin = headers.get("origin")
        if not self.access.origin_allowed(origin, host):
            return 403, f"Origin {origin!r} is not allowed (see --cors-origin)", "permission_error"
        return None

    def _authorized(self, headers: Headers) -> bool:
        given = headers.get("authorization", "")
        token = given[7:].strip().encode() if given[:7].lower() == "bearer " else b""
        token = token or headers.get("x-api-key", "").strip().encode()  # Anthropic's clients send this
        # Compare against every key so timing does not say which prefix matched.
        return any([hmac.compare_digest(token, k) for k in self.keys])

    def _limited(self, receive: Receive, limit: int) -> Receive:
        """Chunked bodies carry no length: count as they arrive."""
        seen = 0

        async def wrapped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, f"request body over {limit} bytes")
            return message

        return wrapped
