"""Where one streamed request's outputs wait for its reader, on the reader's event loop.

An output the reader has not taken yet absorbs the next one (their deltas concatenated), so a
reader that falls behind the engine gets one merged delta per wake-up instead of a queue of
one-token deltas: at 256 streams the event loop's cost per wake-up, not per token, then bounds
throughput (vLLM's RequestOutputCollector does the same)."""
from __future__ import annotations

import asyncio

from mlxr.types import CompletionOutput, RequestOutput


def merge_delta(into: RequestOutput, later: RequestOutput) -> None:
    """Append `later`'s deltas to `into` (both streamed deltas of the same request)."""
    for a, b in zip(into.outputs, later.outputs):
        _merge_completion(a, b)
    into.finished = later.finished
    into.metrics = later.metrics
    into.error = later.error or into.error
    into.num_cached_tokens = later.num_cached_tokens or into.num_cached_tokens


def _merge_completion(a: CompletionOutput, b: CompletionOutput) -> None:
    a.text += b.text
    a.token_ids = a.token_ids + b.token_ids
    if b.logprobs is not None:
        a.logprobs = (a.logprobs or []) + b.logprobs
    a.finish_reason = b.finish_reason
    a.stop_reason = b.stop_reason


class OutputCollector:
    """One request's pending output (and error) on its event loop; put() and get() run there."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._output: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()

    def put(self, item: RequestOutput | BaseException) -> None:
        if isinstance(item, BaseException):
            self._error = self._error or item
        elif self._output is None:
            self._output = item
        else:
            merge_delta(self._output, item)
        self._ready.set()

    async def get(self) -> RequestOutput | BaseException:
        """The pending output (merged), else the error; waits for one."""
        while self._output is None and self._error is None:
            self._ready.clear()
            await self._ready.wait()
        if self._output is not None:
            out, self._output = self._output, None
            return out
        return self._error
