"""What every generating route shares: pick the model, count the request as active, run one
or more engine requests as one merged stream, abort them all when the client goes away, and
trace the whole for metrics and the request log. Used by the OpenAI routes; the Ollama routes
may use it too."""
from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from mlxr.engine.encoder.encoder_engine import EncoderEngine
from mlxr.engine.frontend.async_engine import AsyncEngine
from mlxr.errors import EngineError, InvalidParameterError, MLXRError
from mlxr.server.model_manager import ServedModel
from mlxr.server import warm_requests
from mlxr.server.trace import RequestTrace
from mlxr.types import RequestOutput, SamplingParams

T = TypeVar("T")
_END = object()
CLIENT_CLOSED = 499  # nginx's status for "the client went away"; only ever logged


class ClientDisconnected(Exception):
    pass


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class DisconnectWatch:
    """Races awaits against the client closing its connection (the body is read by then)."""

    def __init__(self, request: Request) -> None:
        self._task = asyncio.ensure_future(_wait_disconnect(request.receive))

    async def run(self, awaitable: Awaitable[T]) -> T:
        work = asyncio.ensure_future(awaitable)
        await asyncio.wait({work, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        raise ClientDisconnected()

    def close(self) -> None:
        self._task.cancel()


async def _next(stream: AsyncIterator[T]) -> T | object:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return _END


def _consume(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it


async def _first_output(engine: AsyncEngine, request_id: str, stream) -> RequestOutput:
    """The stream's first output. It waits on the engine's admission future; cancelling it
    there would cancel that future under the engine thread. Shield it and abort by id instead:
    an abort queued behind the add still finds the request."""
    first = asyncio.ensure_future(anext(stream))
    try:
        return await asyncio.shield(first)
    except asyncio.CancelledError:
        engine.abort(request_id)
        first.add_done_callback(_consume)
        raise


async def _pump(engine: AsyncEngine, request_id: str, prompt: list[int], params: SamplingParams,
                index: int, queue: asyncio.Queue, interval: int, lora_name: str = "") -> None:
    stream = engine.stream(request_id, prompt, params, interval, lora_name)
    try:
        out = await _first_output(engine, request_id, stream)
        queue.put_nowait((index, out))
        if not out.finished:
            async for out in stream:
                queue.put_nowait((index, out))
    except Exception as e:  # noqa: BLE001 - re-raised by the consumer
        queue.put_nowait((index, e))
    finally:
        queue.put_nowait((index, _END))


async def _single_stream(
    engine: AsyncEngine, request_id: str, prompt: list[int], params: SamplingParams, interval: int,
    lora_name: str = "",
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """merge_streams of one prompt without the relay task and queue (two hops less per output,
    what most requests are)."""
    stream = engine.stream(request_id, prompt, params, interval, lora_name)
    out = await _first_output(engine, request_id, stream)
    try:
        yield 0, out
        if not out.finished:
            async for out in stream:
                yield 0, out
    finally:
        await stream.aclose()


def merge_streams(
    engine: AsyncEngine, request_id: str, prompts: list[list[int]], params: SamplingParams, interval: int = 1,
    lora_name: str = "",
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """One engine request per prompt, their outputs as they come (each delta `interval` tokens
    at least but the first and the last), tagged with the prompt's position; closing this
    aborts every one of them. lora_name: the LoRA adapter they run with ("": none)."""
    if len(prompts) == 1:
        return _single_stream(engine, f"{request_id}-0", prompts[0], params, interval, lora_name)
    return _merged(engine, request_id, prompts, params, interval, lora_name)


async def _merged(
    engine: AsyncEngine, request_id: str, prompts: list[list[int]], params: SamplingParams, interval: int,
    lora_name: str = "",
) -> AsyncIterator[tuple[int, RequestOutput]]:
    queue: asyncio.Queue = asyncio.Queue()
    tasks = [asyncio.ensure_future(_pump(engine, f"{request_id}-{i}", p, params, i, queue, interval, lora_name))
             for i, p in enumerate(prompts)]
    try:
        left = len(tasks)
        while left:
            i, item = await queue.get()
            if item is _END:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Session:
    """One HTTP request that generates. Always end it with `await close(status)`."""

    def __init__(self, request: Request, served: ServedModel, trace: RequestTrace, request_id: str,
                 lora_name: str = "") -> None:
        self.request = request
        self.served = served
        self.lora_name = lora_name  # the LoRA adapter the request named as its model ("": none)
        self.trace = trace
        self.request_id = request_id
        self.created = int(time.time())
        self._stream: AsyncIterator[tuple[int, RequestOutput]] | None = None
        self._watch = DisconnectWatch(request)
        self._watching = True
        self._closed = False
        # How a streamed body ended; the body generator overwrites it unless the client left.
        self.outcome: tuple[int, str | None] = (CLIENT_CLOSED, "client disconnected")

    @classmethod
    async def open(cls, request: Request, model: str | None, route: str, id_prefix: str) -> "Session":
        arrival = time.monotonic()
        request_id = f"{id_prefix}{uuid.uuid4().hex}"
        quiet = warm_requests.is_warm_up(request)
        trace = RequestTrace(request_id, route, arrival, None if quiet else request.app.state.metrics, quiet=quiet)
        try:
            # hold: counted as active under the model's lock, so no unload comes in between
            adapter = request.app.state.models.adapters.get(model)  # a LoRA adapter runs on its base
            served = await request.app.state.models.acquire(adapter.base if adapter else model or default_model(request),
                                                            hold=True)
            _check_encoder_route(served, route)
        except InvalidParameterError as e:
            request.app.state.models.release(served)
            trace.finish(status_of(e), str(e))
            raise
        except BaseException as e:
            trace.finish(status_of(e), str(e))
            raise
        # a LoRA adapter named as the model, or a model created with one (ADAPTER) runs with it
        lora = adapter.name if adapter else served.name if served.record.settings.adapter else ""
        trace.model = adapter.name if adapter else served.name
        return cls(request, served, trace, request_id, lora)

    @property
    def model(self) -> str:
        return self.lora_name or self.served.name  # (a model with its own ADAPTER: its name)

    def check_admissible(self, num_prompts: int) -> None:
        """Refuse a batch the admission queue could never take (before any work on it)."""
        check_batch_admissible(num_prompts, self.request.app.state.config.engine.max_waiting)

    async def watched(self, awaitable: Awaitable[T]) -> T:
        """Await work before start() (prompt scoring): ClientDisconnected if the client leaves."""
        return await self._watch.run(awaitable)

    def start(self, prompts: list[list[int]], params: SamplingParams) -> None:
        """Submit one engine request per prompt (each with params.n sequences)."""
        self.check_admissible(len(prompts))
        self.trace.prompt_tokens = sum(len(p) for p in prompts)
        interval = self.request.app.state.config.stream_interval
        self._stream = merge_streams(self.served.engine, self.request_id, prompts, params, interval, self.lora_name)

    async def restart(self, prompt: list[int], params: SamplingParams, tag: str) -> None:
        """Submit a reply's next engine request once the last has ended (the Anthropic API's
        thinking budget continues the reply past the reasoning it closed)."""
        assert self._stream is not None, "start() first"
        await self._stream.aclose()
        interval = self.request.app.state.config.stream_interval
        self._stream = merge_streams(self.served.engine, f"{self.request_id}-{tag}", [prompt], params, interval,
                                     self.lora_name)

    async def next(self) -> tuple[int, RequestOutput] | None:
        """The next output (prompt index, delta), or None when every request finished.
        Raises ClientDisconnected (after aborting) when the client went away."""
        assert self._stream is not None, "start() first"
        if self._watching:
            item = await self._watch.run(_next(self._stream))
        else:
            item = await _next(self._stream)
        if item is _END:
            return None
        index, out = item
        self.trace.on_output(out)
        for o in out.outputs:
            if o.finish_reason == "error" or out.error:
                raise EngineError(out.error or "generation failed")
            if o.finish_reason:
                self.trace.finish_reasons.add(o.finish_reason)
        return index, out

    def stop_watching(self) -> None:
        """Streaming responses: Starlette cancels the body on disconnect from here on."""
        self._watching = False
        self._watch.close()

    async def close(self, status: int, error: str | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self._watch.close()
        try:
            if self._stream is not None:
                await self._stream.aclose()
        finally:  # a failed close must not pin the model (keep_alive would never expire)
            self.request.app.state.models.release(self.served)
            self.trace.finish(status, error)

    async def fail(self, error: BaseException) -> None:
        await self.close(status_of(error), str(error) or type(error).__name__)


ENCODER_ROUTES = ("/v1/embeddings", "/v1/rerank", "/v1/score", "/api/embed", "/api/embeddings", "/tokenize",
                  "/detokenize")


def _check_encoder_route(served: ServedModel, route: str) -> None:
    """An encoder (embedding or reranking model) serves only the embedding and rerank routes."""
    if isinstance(served.engine, EncoderEngine) and route not in ENCODER_ROUTES:
        rerank = served.engine.is_reranker
        what, routes = ("a reranker", "/v1/rerank or /v1/score") if rerank else (
            "an embedding model", "/v1/embeddings or /api/embed")
        raise InvalidParameterError("model", f"{served.name} is {what} (an encoder): it cannot generate text; "
                                             f"use {routes}")


def check_batch_admissible(num_prompts: int, max_waiting: int) -> None:
    """A batch with more prompts than the admission queue holds could never be admitted: a 503
    would have the client retry forever, so it is the client's error to split the batch."""
    if num_prompts > max_waiting:
        raise InvalidParameterError(
            "prompt", f"{num_prompts} prompts in one request is over the server's queue limit of "
                      f"{max_waiting} (--max-waiting); send at most {max_waiting} per request")


def status_of(error: BaseException) -> int:
    if isinstance(error, MLXRError):
        return error.status
    if isinstance(error, (ClientDisconnected, asyncio.CancelledError)):
        return CLIENT_CLOSED
    return getattr(error, "status_code", 500)


def default_model(request: Request) -> str:
    name = request.app.state.default_model
    if not name:
        raise InvalidParameterError("model", "this server has no default model; name one")
    return name


class SessionStream(StreamingResponse):
    """A streaming response that ends its session however the response ends."""

    def __init__(self, session: Session, body: AsyncIterator[str | bytes], media_type: str) -> None:
        super().__init__(body, media_type=media_type, headers={"Cache-Control": "no-cache"})
        self._session = session

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with contextlib.suppress(Exception):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            await self._session.close(*self._session.outcome)
