"""The web UI's live log: a ring of the latest structured log lines, streamed as server-sent events.

GET /admin/logs/stream sends the ring (the backlog) and then every new line as one SSE `data:`
event holding the same JSON object the stderr log prints. sse-starlette's response sends the
keep-alive pings, and ends the stream when uvicorn shuts down: an endless stream would
otherwise hold a graceful shutdown for its whole timeout. GET /admin/config is the server's
configuration without its API keys, for the UI's read-only settings page."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections import deque
from collections.abc import AsyncIterator

from fastapi import APIRouter, Query, Request
from sse_starlette import EventSourceResponse
from starlette.types import Receive, Scope, Send

from mlxr.errors import OverloadedError
from mlxr.server.logs import JSONFormatter

router = APIRouter(tags=["admin"])
RING_LINES = 2000
SUBSCRIBER_QUEUE = 1000  # a reader this far behind loses lines rather than growing memory
HEARTBEAT_S = 15.0
# Each reader costs the event loop every log line (and its backlog when it joins): 200 readers
# slowed /health to 1.6 s. A few web UI tabs need far fewer.
MAX_SUBSCRIBERS = 16


class LogTail(logging.Handler):
    """Keeps the last RING_LINES formatted lines and fans new ones out to live readers."""

    def __init__(self, ring_lines: int = RING_LINES) -> None:
        super().__init__()
        self.setFormatter(JSONFormatter())
        self.ring: deque[str] = deque(maxlen=ring_lines)
        self._readers: dict[asyncio.Queue[str], asyncio.AbstractEventLoop] = {}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)
            return
        self.ring.append(line)
        # One wake-up per event loop, not one per reader.
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Queue[str]]] = {}
        for queue, loop in list(self._readers.items()):
            by_loop.setdefault(loop, []).append(queue)
        for loop, queues in by_loop.items():
            loop.call_soon_threadsafe(_offer, queues, line)

    @property
    def subscribers(self) -> int:
        return len(self._readers)

    def subscribe(self, limit: int | None = None) -> asyncio.Queue[str]:
        """A new reader's queue; past `limit` readers, a 503 (Retry-After) instead."""
        if limit is not None and len(self._readers) >= limit:
            raise OverloadedError(f"{len(self._readers)} log streams are open, the most this server serves "
                                  f"(MAX_SUBSCRIBERS); close one or retry later")
        queue: asyncio.Queue[str] = asyncio.Queue(SUBSCRIBER_QUEUE)
        self._readers[queue] = asyncio.get_running_loop()
        return queue

    def unsubscribe(self, queue: asyncio.Queue[str]) -> None:
        self._readers.pop(queue, None)

    def attach(self) -> None:
        logging.getLogger().addHandler(self)

    def detach(self) -> None:
        logging.getLogger().removeHandler(self)


def _offer(queues: list[asyncio.Queue[str]], line: str) -> None:
    for queue in queues:
        if not queue.full():
            queue.put_nowait(line)


async def _events(tail: LogTail, queue: asyncio.Queue[str], backlog: int) -> AsyncIterator[dict[str, str]]:
    for line in list(tail.ring)[-backlog:] if backlog else []:
        yield {"data": line}
    while True:
        yield {"data": await queue.get()}


class _LogStream(EventSourceResponse):
    """Gives its reader's slot back however the response ends: a client gone before the body
    started never runs the events generator (nor its finally)."""

    def __init__(self, tail: LogTail, queue: asyncio.Queue[str], backlog: int) -> None:
        super().__init__(_events(tail, queue, backlog), ping=HEARTBEAT_S, headers={"Cache-Control": "no-store"})
        self._tail, self._queue = tail, queue

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._tail.unsubscribe(self._queue)


@router.get("/admin/logs/stream")
async def log_stream(request: Request, backlog: int = Query(200, ge=0, le=RING_LINES)) -> EventSourceResponse:
    tail = request.app.state.log_tail
    return _LogStream(tail, tail.subscribe(limit=MAX_SUBSCRIBERS), backlog)


@router.get("/admin/config")
async def server_config(request: Request) -> dict:
    config = dataclasses.asdict(request.app.state.config)
    config["api_key_required"] = bool(config.pop("api_keys"))
    return json.loads(json.dumps(config, default=str))
