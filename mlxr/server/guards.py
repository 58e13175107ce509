"""ASGI middleware in front of every route: API key and request body size.

Pure ASGI rather than BaseHTTPMiddleware so streamed responses and client disconnects pass
through untouched."""
from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

OPEN_PATHS = frozenset({"/health"})


def as_json_body(scope: Scope) -> Scope:
    """Ollama's documented usage is `curl URL -d '{json}'`, which sends a form content type;
    Ollama reads every body as JSON, so /api routes do too."""
    if not scope["path"].startswith("/api/"):
        return scope
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


class Guard:
    def __init__(self, app: ASGIApp, api_keys: tuple[str, ...], max_body_bytes: int, respond) -> None:
        # respond(path, status, message, kind) -> an ASGI response in the route family's shape.
        self.app = app
        self.keys = [k.encode() for k in api_keys]
        self.max_body = max_body_bytes
        self.respond = respond

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # The path the router will dispatch on; never a URL rebuilt from Host headers.
        path = scope["path"]
        headers = Headers(scope=scope)
        if self.keys and path not in OPEN_PATHS and not self._authorized(headers):
            await self.respond(path, 401, "missing or invalid API key", "authentication_error")(scope, receive, send)
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            msg = f"request body over {self.max_body} bytes"
            await self.respond(path, 413, msg, "invalid_request_error")(scope, receive, send)
            return
        await self.app(as_json_body(scope), self._limited(receive), send)

    def _authorized(self, headers: Headers) -> bool:
        given = headers.get("authorization", "")
        token = given[7:].strip().encode() if given[:7].lower() == "bearer " else b""
        # Compare against every key so timing does not say which prefix matched.
        return any([hmac.compare_digest(token, k) for k in self.keys])

    def _limited(self, receive: Receive) -> Receive:
        """Chunked bodies carry no length: count as they arrive."""
        seen = 0

        async def wrapped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise HTTPException(413, f"request body over {self.max_body} bytes")
            return message

        return wrapped
