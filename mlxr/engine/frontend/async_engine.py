"""AsyncEngine: one background thread owns the model and loops schedule -> run -> update;
each request gets an async stream of RequestOutput deltas; abort works from any thread."""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from mlxr.engine.frontend.core_client import InprocClient
from mlxr.engine.frontend.llm_engine import LLMEngine
from mlxr.engine.frontend.output_collector import OutputCollector
from mlxr.engine.structured.check_process import check_bounded
from mlxr.errors import EngineDeadError, OverloadedError
from mlxr.types import EngineStats, RequestOutput, SamplingParams, TokenLogprobs

log = logging.getLogger(__name__)


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    sink: "_Sink"
    accepted: Future
    lora_name: str = ""


@dataclass
class _Call:
    """A function to run on the engine thread between steps (embeddings, say)."""

    fn: object
    result: Future


def _put_all(items: list[tuple[OutputCollector, RequestOutput]]) -> None:
    for collector, out in items:
        collector.put(out)


@dataclass
class _Sink:
    """Where a request's outputs go: a collector living on the caller's event loop."""

    loop: asyncio.AbstractEventLoop
    collector: OutputCollector

    def put(self, item: RequestOutput | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.collector.put, item)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening
            pass


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._lock = threading.Lock()  # guards the engine between its thread and stats()
        self._wake = threading.Condition(threading.Lock())
        self._adds: list[_Add] = []
        self._aborts: list[str] = []
        self._calls: list[_Call] = []
        self._sinks: dict[str, _Sink] = {}
        self._stop = False
        self._closed = False  # set once the engine thread has stopped taking work
        # The thread count the model was loaded with (torch's process default, which new threads
        # inherit); Ollama's num_thread changes it per request, a request without it restores it.
        self.default_threads = torch.get_num_threads()
        self._threads = self.default_threads
        self._thread = threading.Thread(target=self._loop, name="mlxr-engine", daemon=True)
        self._thread.start()

    # --- public API (any thread / event loop) ------------------------------------------------
    async def stream(
        self, request_id: str, prompt: str | list[int], params: SamplingParams, stream_interval: int = 1,
        lora_name: str = "",
    ) -> AsyncIterator[RequestOutput]:
        """Deltas of one request until it finishes; closing the iterator aborts it. A delta
        gathers stream_interval tokens at least, except the first and the last. lora_name: a
        loaded LoRA adapter the request runs with ("": the base model).
        Admission errors (invalid prompt, too long, overloaded) raise before the first yield."""
        if params.structured_outputs is not None:  # off the engine thread, which serves the others
            await check_bounded(params.structured_outputs)
        loop = asyncio.get_running_loop()
        sink = _Sink(loop, OutputCollector(loop, stream_interval))
        accepted: Future = Future()
        self._submit(adds=[_Add(request_id, prompt, params, sink, accepted, lora_name)])
        try:
            await asyncio.wrap_future(accepted)
        except asyncio.CancelledError:
            self.abort(request_id)  # the engine may have admitted it already
            raise
        finished = False
        try:
            while not finished:
                item = await sink.collector.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._submit(aborts=[request_id])

    async def lora(self, op: str, name: str = "", path: str = "") -> None:
        """Load ("load") or unload ("unload") a LoRA adapter on the engine thread, between steps:
        requests running keep theirs."""
        fn = {"load": lambda: self.engine.load_lora(name, path), "unload": lambda: self.engine.unload_lora(name)}[op]
        call = _Call(fn, Future())
        self._submit(calls=[call])
        await asyncio.wrap_future(call.result)

    @property
    def lora_names(self) -> list[str]:
        return self.engine.lora_names

    async def embed(self, prompt: str | list[int]) -> tuple[list[float], int]:
        """Embedding of one input, computed on the engine thread between steps."""
        call = _Call(lambda: self.engine.embed(prompt), Future())
        self._submit(calls=[call])
        return await asyncio.wrap_future(call.result)

    async def prompt_logprobs(self, prompt: str | list[int], top: int) -> tuple[list[int], list[TokenLogprobs | None]]:
        """LLMEngine.prompt_logprobs: the forward on the engine thread between steps, the
        tokens' texts (up to 21 a position) decoded on another thread, not in the steps' way."""
        call = _Call(lambda: self.engine.score_prompt(prompt, top), Future())
        self._submit(calls=[call])
        ids, scored = await asyncio.wrap_future(call.result)
        return ids, await asyncio.to_thread(self.engine.logprob_entries, scored)

    async def last_token_logprob(self, ids: list[int]) -> float:
        """The logprob of ids' last token given the ones before it (a decoder reranker's answer
        token), computed as prompt logprobs are, the lm_head on that one position only; the
        prompt's full blocks stay cached, so a second answer token costs little."""
        call = _Call(lambda: self.engine.score_prompt(ids, 0, first=len(ids) - 2)[1][-1].logprob, Future())
        self._submit(calls=[call])
        return await asyncio.wrap_future(call.result)

    async def use_cpu_threads(self, n: int | None) -> bool:
        """Run the model's CPU math on n threads (None: the load-time default) from the next
        step on, as Ollama's num_thread sets its runner's threads. Applied on the engine thread,
        whose OpenMP setting the model's ops and C kernels read. False where it cannot apply: a
        GPU model, or an engine core in a process of its own."""
        n = self.default_threads if n is None else n
        if self.engine.on_gpu or not isinstance(self.engine.core, InprocClient):
            return False
        if n != self._threads:
            self._threads = n
            call = _Call(lambda: torch.set_num_threads(n), Future())
            self._submit(calls=[call])
            await asyncio.wrap_future(call.result)
            log.info("CPU threads of this model set to %d", n)
        return True

    def stats(self) -> EngineStats:
        with self._lock:
            return self.engine.stats()

    def forget_counts(self, core: bool = True) -> None:
        with self._lock:
            self.engine.forget_counts(core)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def on_gpu(self) -> bool:
        return self.engine.on_gpu

    def shutdown(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout=30)
        self.engine.shutdown()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.engine.core_alive

    # --- the engine thread -------------------------------------------------------------------
    def _submit(self, adds: list[_Add] = (), aborts: list[str] = (), calls: list[_Call] = ()) -> None:
        with self._wake:
            if self._closed or not self._thread.is_alive():
                if adds or calls:
                    raise OverloadedError("the model is unloading; retry the request")
                return
            self._adds += adds
            self._aborts += aborts
            self._calls += calls
            self._wake.notify()

    def _take_commands(self) -> tuple[list[_Add], list[str], list[_Call]] | None:
        with self._wake:
            while not (self._adds or self._aborts or self._calls or self._stop or self.engine.has_unfinished()):
                self._wake.wait()
            if self._stop:
                return None
            commands = self._adds, self._aborts, self._calls
            self._adds, self._aborts, self._calls = [], [], []
            return commands

    def _loop(self) -> None:
        try:
            while (commands := self._take_commands()) is not None:
                adds, aborts, calls = commands
                with self._lock:
                    outputs = self._apply(adds, aborts)
                    self._run_calls(calls)
                    outputs += self._step()
                self._deliver_all(outputs)
                if not self.engine.core_alive:
                    log.error("the engine core is gone; this engine stops")
                    break
        finally:
            self._close()

    def _close(self) -> None:
        """Stop taking work and fail everything still pending, so no caller waits forever."""
        with self._wake:
            self._closed = True
            adds, calls = self._adds, self._calls
            self._adds, self._calls, self._aborts = [], [], []
        error = OverloadedError("the model was unloaded; retry the request")
        for item in [*(a.accepted for a in adds), *(c.result for c in calls)]:
            if item.set_running_or_notify_cancel():
                item.set_exception(error)
        # Requests still running fail with a 503 that says why: the model was unloaded (the
        # server stopping; the manager unloads no model its requests hold), or the core died
        # between a step and the check after it (EngineDeadError; the requests the frontend failed
        # itself end as error outputs, which the server answers as 500s).
        self._fail_all(OverloadedError("the model was unloaded while this request ran; retry the request")
                       if self.engine.core_alive
                       else EngineDeadError("the engine core stopped; the model loads again on the next request"))

    def _apply(self, adds: list[_Add], aborts: list[str]) -> list[RequestOutput]:
        for add in adds:
            if not add.accepted.set_running_or_notify_cancel():
                continue  # the caller went away before admission
            try:
                self.engine.add_request(add.request_id, add.prompt, add.params, stream_deltas=True,
                                        lora_name=add.lora_name)
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                add.accepted.set_exception(e)
                continue
            self._sinks[add.request_id] = add.sink
            add.accepted.set_result(True)
        aborted = [self._abort(rid) for rid in aborts]
        return [out for out in aborted if out is not None]

    def _abort(self, request_id: str) -> RequestOutput | None:
        """engine.abort, never raising: a failed abort (its core gone between two calls) must not
        stop the engine thread, which still has every other request to finish or fail."""
        try:
            return self.engine.abort(request_id)
        except Exception:  # noqa: BLE001 - logged; the request is over for its caller either way
            log.exception("aborting %s failed", request_id)
            return None

    @staticmethod
    def _run_calls(calls: list[_Call]) -> None:
        for call in calls:
            if not call.result.set_running_or_notify_cancel():
                continue
            try:
                call.result.set_result(call.fn())
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                call.result.set_exception(e)

    def _step(self) -> list[RequestOutput]:
        if not self.engine.has_unfinished():
            return []
        try:
            return self.engine.step()
        except Exception as e:  # noqa: BLE001 - a bug in a step must not kill the server
            log.exception("engine step failed; failing the requests in flight")
            self._fail_all(e)
            return []

    def _deliver_all(self, outputs: list[RequestOutput]) -> None:
        """A step's outputs to their streams: one wake-up per event loop, not one per output
        (at 256 streams a wake-up each cost the loop more than the tokens did)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[OutputCollector, RequestOutput]]] = {}
        sinks = self._sinks
        for out in outputs:
            sink = sinks.get(out.request_id)
            if sink is None:
                continue
            if out.finished:
                del sinks[out.request_id]
            by_loop.setdefault(sink.loop, []).append((sink.collector, out))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that event loop is closed: nobody is listening
                pass

    def _fail_all(self, error: BaseException) -> None:
        for rid in list(self._sinks):
            self._abort(rid)
            self._sinks.pop(rid).put(error)
