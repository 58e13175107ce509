"""The engine core's structured-output manager: requests wait here while their grammar compiles
(on the compiler's thread, so the step loop keeps running), and each step that samples a
constrained row gets the packed token bitmask of its rows, filled on the host from the matchers.

The mask of a row needs the row's previous token taken by its matcher, but the runner launches a
step before the previous step's tokens reach the host. So for a step with a constrained row the
engine core queues the forward, lands the previous step while the forward runs, fills the mask
here, and only then queues sampling (ModelRunner.execute's before_sample; under overlap the
forward is queued one engine call ahead, and the mask starts filling at the end of that call:
core/in_flight.py, StepsInFlight.forward_ahead).
A step with no constrained row keeps the plain overlap. How a mask is filled: fill.py; a large
batch's may fill on a worker thread while the step thread hands on outputs, schedules the next
step and the sampler draws its per-row numbers (mask_job.py): the sampler waits for it only to
apply it. Whether the worker pays off (waking it costs a time slice on a loaded host) is timed
as the step thread's own time a row, each way (chooser.py)."""
from __future__ import annotations

import time
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from mlxr.engine.records import EngineCoreOutput
from mlxr.engine.sched.request import Request
from mlxr.engine.structured.chooser import KindChooser
from mlxr.engine.structured.fill import FillTiming, MaskFiller
from mlxr.engine.structured.mask_job import FillThread, MaskBuffers, PendingMask

COMPILE_TIMEOUT_S = 30.0  # a safety net: the frontend's check already bounded the compile
WAIT_S = 0.005  # how long an idle step waits for compiles before returning
# How long a ready request may wait for the others of its burst while the engine is idle: 64
# compiles of bench/structured_overhead.py's schema take ~17 ms on 2 cores (compiler.py). Counted
# from the end of its own compile, so the vocabulary's view, built once before the first
# compiles (0.2 s for 49k tokens), does not use it up.
HOLD_S = 0.05


@dataclass
class _Pending:
    request: Request
    future: Future
    since: float = field(default_factory=time.monotonic)
    ready_at: float | None = None  # when its compile ended (set on the compiler's thread)

    def __post_init__(self) -> None:
        self.future.add_done_callback(self._ready)

    def _ready(self, _future: Future) -> None:
        self.ready_at = time.monotonic()


class StructuredOutputManager:
    def __init__(self, tokenizer, vocab_size: int, pin_masks: bool = False) -> None:
        """pin_masks: masks go to a CUDA device, so they are built in pinned memory (their copy
        is queued from there, without a staging copy)."""
        self._tokenizer, self._vocab_size, self._pin = tokenizer, vocab_size, pin_masks
        self._compiler = None  # GrammarCompiler, built on the first constrained request
        self.filler: MaskFiller | None = None
        self._buffers: MaskBuffers | None = None
        self._worker: FillThread | None = None
        self._filling = None  # the worker's last fill (a Future)
        self._where = KindChooser(("step_thread", "worker"), run=2)
        self.pending: dict[str, _Pending] = {}
        self.live: set[str] = set()  # constrained requests in the scheduler

    @property
    def timing(self) -> FillTiming:
        return self.filler.timing if self.filler is not None else FillTiming()

    @property
    def where_us_per_row(self) -> dict[str, float | None]:
        """The step thread's time a row for a large batch's fill, each way (chooser.py)."""
        return self._where.us_per_row

    # --- admission ---------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        rid = request.request_id
        if self._tokenizer is None:
            self.pending[rid] = _Pending(request, _failed("this engine has no tokenizer for structured output"))
            return
        if self._compiler is None:
            import llguidance

            from mlxr.engine.structured.compiler import GrammarCompiler
            self._compiler = GrammarCompiler(self._tokenizer, self._vocab_size)
            from mlxr.engine.structured.matcher import executor
            self.filler = MaskFiller(executor(), llguidance.LLExecutor(num_threads=1))
            self._buffers = MaskBuffers((self._compiler.vocab_size + 31) // 32, self._pin)
            self._worker = FillThread()
        self.pending[rid] = _Pending(request, self._compiler.submit(request.params.structured_outputs))

    def abort(self, request_ids: list[str]) -> None:
        if self.pending:
            for rid in request_ids:
                self.pending.pop(rid, None)

    @property
    def busy(self) -> bool:
        return bool(self.pending)

    def admit(self, scheduler, idle: bool = False) -> list[EngineCoreOutput]:
        """Hand the requests whose grammar is ready to the scheduler; error outputs for the rest
        that failed. idle: the engine has nothing else to run; then a ready request waits (at
        most HOLD_S from the end of its compile) while others still compile, so a burst starts
        in one prefill step rather than in a step per few compiles (each such step runs eagerly
        beside the rows already decoding, and they decode in a smaller batch)."""
        if self.live:
            self.live &= scheduler.requests.keys()
        if not self.pending:
            return []
        failed, now = [], time.monotonic()
        hold = idle and any(not p.future.done() for p in self.pending.values())
        for rid, p in list(self.pending.items()):
            if not p.future.done():
                if now - p.since > COMPILE_TIMEOUT_S:
                    del self.pending[rid]
                    failed.append(_error(rid, f"the grammar did not compile in {COMPILE_TIMEOUT_S:.0f} s"))
                continue
            if hold and now - (p.ready_at or now) < HOLD_S and p.future.exception() is None:
                continue
            del self.pending[rid]
            try:
                p.request.grammar = p.future.result()
            except Exception as e:  # noqa: BLE001 - the request fails, not the engine
                failed.append(_error(rid, str(e)))
                continue
            scheduler.add(p.request)
            self.live.add(rid)
        return failed

    def wait_for_compile(self) -> None:
        """Block briefly while only compiles are outstanding (rather than spin): until they are
        all done, at most WAIT_S."""
        futures.wait([p.future for p in self.pending.values()], timeout=WAIT_S)

    # --- the step ----------------------------------------------------------------------------
    def constrains(self, request_ids: list[str]) -> bool:
        live = self.live
        return bool(live) and any(rid in live for rid in request_ids)

    def bitmask(self, rows: list[Request | None]):
        """The rows' packed int32 bitmask [len(rows), words] on the host: each constrained row's
        allowed tokens at its next position, every bit set for the others; None when no row is
        constrained. A large batch's may come back pending (a callable that waits for it), its
        fill under way on the worker: the caller must not touch the rows' matchers until then."""
        matchers, free = [], []
        for i, r in enumerate(rows):
            grammar = r.grammar if r is not None else None
            if grammar is not None and not grammar.done:
                matchers.append((grammar.matcher, i))
            else:
                free.append(i)
        if not matchers:
            return None
        mask = self._buffers.take(len(rows))
        # The free rows all-allowed in one op, not one a row (bench/probes/constrained_host.py's
        # reset_rows_*); a constrained row's words are all written by its fill.
        if free:
            mask.index_fill_(0, torch.tensor(free, dtype=torch.long), -1)
        return self._fill(matchers, mask)

    def position_bitmask(self, rows: list[Request | None], drafts: list[list[int]]) -> torch.Tensor | None:
        """A drafting step's packed bitmask on the host, a row per sampled position: each row's
        1 + len(its drafts) positions in turn, a constrained row's position j holding what its
        grammar allows after its first j drafts; every bit set for the other rows, and for the
        positions past a draft the grammar refuses (verification rejects that draft, so nothing
        is sampled there). None when no row is constrained. Filled on the step thread: a
        drafting step has landed the step before it, so the matchers are up to date."""
        drafting, plain, offset = [], [], 0
        for r, d in zip(rows, drafts):
            grammar = r.grammar if r is not None else None
            if grammar is not None and not grammar.done:
                if d:
                    drafting.append((grammar.matcher, offset, list(d)))
                else:
                    plain.append((grammar.matcher, offset))
            offset += 1 + len(d)
        if not drafting and not plain:
            return None
        mask = self._buffers.take(offset)
        mask.fill_(-1)
        if drafting:
            self.filler.fill_with_drafts(drafting, mask)
        if plain:
            self.filler.fill(plain, mask)
        return mask

    def _fill(self, matchers: list[tuple[object, int]], mask: torch.Tensor):
        filler, where, n = self.filler, self._where, len(matchers)
        start = time.perf_counter()
        if where.choose(n) == "step_thread":
            filler.fill(matchers, mask)
            where.learn("step_thread", n, time.perf_counter() - start)
            return mask
        self._filling = future = self._worker.start(lambda: filler.fill(matchers, mask, off_step_thread=True))
        handoff = time.perf_counter() - start

        def waited(seconds: float) -> None:  # the step thread's cost: hand-off and wait
            filler.timing.add_wait(seconds)
            where.learn("worker", n, handoff + seconds)
        return PendingMask(future, mask, waited)

    def settle(self) -> None:
        """Wait for a fill still on the worker (a step failed before its sampling waited for
        its mask): the matchers are free again to take tokens."""
        filling, self._filling = self._filling, None
        if filling is not None:
            filling.exception()  # waits; the error, if any, was the failed step's

    def shutdown(self) -> None:
        if self._compiler is not None:
            self._compiler.shutdown()
            self._worker.shutdown()


def _failed(message: str) -> Future:
    future: Future = Future()
    future.set_exception(RuntimeError(message))
    return future


def _error(request_id: str, message: str) -> EngineCoreOutput:
    return EngineCoreOutput(request_id, finish_reason="error", error=message)
