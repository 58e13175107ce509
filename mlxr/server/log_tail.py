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

from mlxr.server.logs import JSONFormatter

router = APIRouter(tags=["admin"])
RING_LINES = 2000
SUBSCRIBER_QUEUE = 1000  # a reader this far behind loses lines rather than growing memory
HEARTBEAT_S = 15.0


class LogTail(logging.Handler):
    """Keeps the last RING_LINES formatted lines and fans new ones out to live readers."""

    def __init__(self, ring_lines: int = RING_LINES) -> None:
        super().__init__()
        self.setFormatter(JSONFormatter())
        self.ring: deque[str] = deque(maxlen=ring_lines)
        self._readers: set[tuple[asyncio.AbstractEventLoop, asyncio.Queue[str]]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)
            return
        self.ring.append(line)
        for loop, queue in list(self._readers):
            loop.call_soon_threadsafe(_offer, queue, line)

    def subscribe(self) -> asyncio.Queue[str]:
        queue: asyncio.Queue[str] = asyncio.Queue(SUBSCRIBER_QUEUE)
        self._readers.add((asyncio.get_running_loop(), queue))
        return queue

    def unsubscribe(self, queue: asyncio.Queue[str]) -> None:
        self._readers = {r for r in self._readers if r[1] is not queue}

    def attach(self) -> None:
        logging.getLogger().addHandler(self)

    def detach(self) -> None:
        logging.getLogger().removeHandler(self)


def _offer(queue: asyncio.Queue[str], line: str) -> None:
    if not queue.full():
        queue.put_nowait(line)


async def _events(tail: LogTail, backlog: int) -> AsyncIterator[dict[str, str]]:
    queue = tail.subscribe()
    try:
        for line in list(tail.ring)[-backlog:] if backlog else []:
            yield {"data": line}
        while True:
            yield {"data": await queue.get()}
    finally:
        tail.unsubscribe(queue)


@router.get("/admin/logs/stream")
async def log_stream(request: Request, backlog: int = Query(200, ge=0, le=RING_LINES)) -> EventSourceResponse:
    return EventSourceResponse(_events(request.app.state.log_tail, backlog), ping=HEARTBEAT_S,
                               headers={"Cache-Control": "no-store"})


@router.get("/admin/config")
async def server_config(request: Request) -> dict:
    config = dataclasses.asdict(request.app.state.config)
    config["api_key_required"] = bool(config.pop("api_keys"))
    return json.loads(json.dumps(config, default=str))
