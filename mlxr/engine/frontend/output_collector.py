"""Where one streamed request's outputs wait for its reader, on the reader's event loop.

An output the reader has not taken yet absorbs the next one (their deltas concatenated), so a
reader that falls behind the engine gets one merged delta per wake-up instead of a queue of
one-token deltas: at 256 streams the event loop's cost per wake-up, not per token, then bounds
throughput (vLLM's RequestOutputCollector does the same). A stream interval of k > 1 holds the
reader back until k tokens wait (vLLM's --stream-interval); the first token and the end are
never held."""
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

    def __init__(self, loop: asyncio.AbstractEventLoop, stream_interval: int = 1) -> None:
        self.loop = loop
        self._output: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self._interval = stream_interval
        self._held_tokens = 0  # tokens in _output (counted only when an interval applies)
        self._first_token_taken = False

    def put(self, item: RequestOutput | BaseException) -> None:
        if isinstance(item, BaseException):
            self._error = self._error or item
        elif self._output is None:
            self._output = item
        else:
            merge_delta(self._output, item)
        if self._interval == 1 or isinstance(item, BaseException) or self._due(item):
            self._ready.set()

    def _due(self, item: RequestOutput) -> bool:
        self._held_tokens += sum(len(o.token_ids) for o in item.outputs)
        return item.finished or not self._first_token_taken or self._held_tokens >= self._interval

    async def get(self) -> RequestOutput | BaseException:
        """The pending output (merged) once it is due, else the error; waits for one."""
        while not self._ready.is_set():
            await self._ready.wait()
        if self._output is not None:
            out, self._output = self._output, None
            self._first_token_taken = self._first_token_taken or self._held_tokens > 0
            self._held_tokens = 0
            if self._error is None:
                self._ready.clear()
            return out
        return self._error
