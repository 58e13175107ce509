"""Unexpected exceptions as a 500 inside the application, so the client's connection survives.

Starlette answers an exception that no handler claims in its outermost middleware and then
raises it again for the server to log, and uvicorn closes the connection after that: a client
that keeps its connection alive (the ollama client, httpx) then fails its next request with a
reset. Here, inside the other middleware, the exception is logged and answered and goes no
further. A response already under way cannot be replaced: that exception goes on up."""
from __future__ import annotations

import logging
from typing import Callable

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("mlxr.server.app")


class InternalErrors:
    def __init__(self, app: ASGIApp, respond: Callable[..., Response]) -> None:
        self.app, self.respond = app, respond

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            if started:
                raise
            path = scope.get("path", "")
            log.exception("unhandled error on %s", path)
            await self.respond(path, 500, "internal error", "internal_error")(scope, receive, send)
