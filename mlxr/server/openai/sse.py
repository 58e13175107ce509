"""Server-sent events: `data: {json}\n\n` per chunk, then `data: [DONE]\n\n`."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import orjson

from mlxr.errors import MLXRError
from mlxr.server.session import Session, SessionStream, status_of
from mlxr.types import RequestOutput

DONE = "data: [DONE]\n\n"
Chunks = list[dict]


def sse(obj: dict) -> str:
    return f"data: {orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS).decode()}\n\n"


def error_chunk(error: BaseException) -> dict:
    status = status_of(error)
    message = error.message if isinstance(error, MLXRError) else "internal error"
    kind = error.kind if isinstance(error, MLXRError) else "internal_error"
    param = error.param if isinstance(error, MLXRError) else None
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


async def events(
    session: Session,
    first: tuple[int, RequestOutput] | None,
    head: Chunks,
    on_output: Callable[[int, RequestOutput], Chunks],
    tail: Callable[[], Chunks],
) -> AsyncIterator[str]:
    """The body of a streamed response. A client that leaves cancels this generator
    (Starlette), which closes the engine streams under it and so aborts them."""
    try:
        for chunk in head:
            yield sse(chunk)
        item = first
        while item is not None:
            for chunk in on_output(*item):
                yield sse(chunk)
            item = await session.next()
        for chunk in tail():
            yield sse(chunk)
        session.outcome = (200, None)
    except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band
        session.outcome = (status_of(e), str(e) or type(e).__name__)
        yield sse(error_chunk(e))
    yield DONE


def stream_response(session: Session, body: AsyncIterator[str]) -> SessionStream:
    session.stop_watching()
    return SessionStream(session, body, media_type="text/event-stream")
