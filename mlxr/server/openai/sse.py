"""Server-sent events: `data: {json}\n\n` per chunk, then `data: [DONE]\n\n`."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from mlxr.errors import MLXRError
from mlxr.server.session import Session, SessionStream, status_of
from mlxr.types import RequestOutput

DONE = b"data: [DONE]\n\n"
Chunks = list[dict]


def sse(obj: dict) -> bytes:
    # Bytes, not str: the response would encode a str again, once per chunk.
    return b"data: " + orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS) + b"\n\n"


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
    source: Any = None,
) -> AsyncIterator[bytes]:
    """The body of a streamed response. A client that leaves cancels this generator
    (Starlette), which closes the engine streams under it and so aborts them. source: what
    the outputs come from (a BudgetedReply), the session's own by default."""
    source = source or session
    try:
        for chunk in head:
            yield sse(chunk)
        item = first
        while item is not None:
            chunks = on_output(*item)
            if chunks:  # one write for an output's chunks (n > 1 gives one a choice)
                yield b"".join(map(sse, chunks))
            item = await source.next()
        end = b"".join(map(sse, tail()))
        session.outcome = (200, None)
    except Exception as e:  # noqa: BLE001 - the status line is gone; report in-band
        session.outcome = (status_of(e), str(e) or type(e).__name__)
        end = sse(error_chunk(e))
    yield end + DONE


def stream_response(session: Session, body: AsyncIterator[bytes]) -> SessionStream:
    session.stop_watching()
    return SessionStream(session, body, media_type="text/event-stream")
