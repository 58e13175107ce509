"""Models served by the daemon: loaded on demand by name, each with its own AsyncEngine,
unloaded after keep_alive or when room is needed for another.

Under `mlxr serve --api-servers N` (N > 1) the models are pinned instead: each API process
attaches to the engine cores its supervisor started (`attached`: model name -> channel), serves
those models only, never unloads them, and attaches again when a core was restarted.

A model is never unloaded from under the requests that hold it (`active`, counted under the
model's lock): an unload finds it busy and leaves it, and a name re-pointed at another model
(/api/create, /api/copy) loads the new one on its next request while the old engine finishes
the requests it has and shuts down after the last one."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field, replace

from mlxr.config import ServerConfig
from mlxr.engine.core.core_attach import Attachment
from mlxr.engine.frontend.async_engine import AsyncEngine
from mlxr.engine_factory import ModelSpec, attach_engine, build_encoder_engine, build_engine, is_encoder_model
from mlxr.errors import ModelNotFoundError, OverloadedError
from mlxr.llm import _parse_dtype
from mlxr.loader.sampling_defaults import SamplingDefaults, model_sampling_defaults
from mlxr.model_config import ModelArgs
from mlxr.server.lora_table import AdapterTable

log = logging.getLogger(__name__)
TOUCH_EVERY_S = 1.0
# How long a request for a model that is not loaded waits for a busy model to free its slot
# (Ollama queues such requests and its client does not retry); past it, 503 with Retry-After.
SLOT_WAIT_S = float(os.environ.get("MLXR_MODEL_SLOT_WAIT_S", "120"))
# A slot also frees without a release() (a model's lock let go, an unload); look again this often.
SLOT_POLL_S = 0.5


def model_spec(config: ServerConfig, record) -> ModelSpec:
    """How the server loads a registry model: its path (and projector) with the server's device settings."""
    dtype = _parse_dtype(config.dtype) if config.dtype else None
    projector = getattr(record, "projector", None)
    return ModelSpec(str(record.path), dtype=dtype, device=config.device, quantization=config.quantization,
                     projector=str(projector) if projector else None)


@dataclass(eq=False)  # by identity: a name's engine is replaced by another on re-point
class ServedModel:
    name: str  # registry name, "name:tag"
    record: object  # mlxr.registry.ModelRecord
    args: ModelArgs
    tokenizer: object  # mlxr.tokenizer.tokenizer.Tokenizer
    engine: AsyncEngine  # or an EncoderEngine (embedding and reranking models), which answers the same calls
    loaded_at: float  # time.time()
    load_duration_s: float
    expires_at: float | None  # time.time(); None = never
    active: int = field(default=0)  # requests in flight
    retired: bool = field(default=False)  # replaced under its name: shuts down after its last request
    # The keep_alive of the latest request (None: the server's default). As in Ollama, the
    # latest one wins: the timer restarts from it when any request ends.
    keep_alive_s: float | None = field(default=None)
    # Sampling values the model asks for where a request sets none (its files, preset, Modelfile).
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)

    @property
    def context_length(self) -> int:
        return self.engine.max_model_len


class ModelManager:
    def __init__(self, config: ServerConfig, registry, attached: dict[str, Attachment] | None = None) -> None:
        self.config = config
        self.registry = registry
        self.attached = attached  # None: models load on demand in this process's own cores
        self.served: dict[str, ServedModel] = {}
        self.adapters = AdapterTable()  # LoRA adapters by name, each on its base model
        self._locks: dict[str, asyncio.Lock] = {}
        self._loading = asyncio.Lock()
        self._reaper: asyncio.Task | None = None
        self._used_at: dict[str, float] = {}  # time.monotonic() of the last registry.touch
        self._retired: set[ServedModel] = set()  # replaced engines still running requests
        self._retiring: set[asyncio.Task] = set()  # their shutdowns under way
        self._slot_freed = asyncio.Event()  # a loaded model went idle: a waiting load may take its slot
        # name -> {"started_at": time.time(), "stage": "waiting for another load" | "waiting for a slot" |
        # "loading", "stage_at": when that stage began}: the loads under way, for GET /admin/loading
        self.loading: dict[str, dict] = {}
        self.last_load_s: dict[str, float] = {}  # name -> how long its latest load took, kept after unload

    def canonical(self, name: str) -> str:
        return self.registry.resolve(name).name

    async def acquire(self, name: str, keep_alive_s: float | None = None, hold: bool = False) -> ServedModel:
        """The served model, loading it first if needed; resets its keep-alive timer.
        hold: count a request on it (`active`), under the model's lock so that no unload can
        come between; end it with release(). A name that now resolves to other model files
        than the loaded ones (re-pointed by create or copy) loads those; the old engine shuts
        down once its requests end. Raises ModelNotFoundError for names the registry does not
        know."""
        record = self.registry.resolve(name)  # raises ModelNotFoundError
        if self.attached is not None and record.name not in self.attached:
            raise ModelNotFoundError(
                f"model {record.name!r} is not served: with --api-servers {self.config.api_servers} the server "
                f"serves only the models given with --model at start ({', '.join(self.attached)})")
        lock = self._locks.setdefault(record.name, asyncio.Lock())
        async with lock:
            served = self.served.get(record.name)
            if served is not None and not served.engine.is_alive:
                log.error("the engine of %s stopped; loading it again", record.name)
                self.served.pop(record.name)
                await asyncio.to_thread(served.engine.shutdown)
                served = None
            if served is not None and not same_model(served.record, record):
                log.info("model %s now names %s; loading it", record.name, record.path)
                self.served.pop(record.name)
                await self._retire(served)
                served = None
            if served is not None:
                served.record = record  # settings (system, parameters) may have changed; the files did not
            else:
                now = time.time()
                state = self.loading[record.name] = {"started_at": now, "stage": "waiting for another load", "stage_at": now}
                try:
                    async with self._loading:  # one load at a time, so the limit holds
                        state.update(stage="waiting for a slot", stage_at=time.time())
                        if self.attached is None:
                            await self._make_room()
                        state.update(stage="loading", stage_at=time.time())
                        served = await asyncio.to_thread(self._load, record)
                        self.served[record.name] = served
                finally:
                    self.loading.pop(record.name, None)
                self.last_load_s[record.name] = served.load_duration_s
            if hold:
                served.active += 1
        self.touch(served, keep_alive_s)
        self._record_use(record.name)
        return served

    def release(self, served: ServedModel) -> None:
        """A request that acquire(hold=True) counted has ended."""
        served.active -= 1
        if served.active <= 0:
            self._slot_freed.set()
        if served.retired and served.active <= 0 and served in self._retired:
            self._retired.discard(served)
            task = asyncio.ensure_future(self._shut_down(served))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, served: ServedModel) -> None:
        """Shut down an engine no longer served under its name: now when idle, else after the
        last of its requests (release)."""
        if served.active <= 0:
            await self._shut_down(served)
        else:
            served.retired = True
            self._retired.add(served)

    async def _shut_down(self, served: ServedModel) -> None:
        try:
            await asyncio.to_thread(served.engine.shutdown)
        except Exception:  # noqa: BLE001 - an engine that fails to stop must not fail a request
            log.exception("shutting down the engine of %s failed", served.name)
        else:
            log.info("unloaded model %s (%s)", served.name, served.record.path)

    def _record_use(self, name: str) -> None:
        """The registry's last-used time, written at most once a second per model as the
        registry itself does: skipping the call saves a SQLite connection per request."""
        now = time.monotonic()
        if now - self._used_at.get(name, -TOUCH_EVERY_S) >= TOUCH_EVERY_S:
            self._used_at[name] = now
            self.registry.touch(name)

    def _load(self, record) -> ServedModel:
        t0 = time.perf_counter()
        log.info("loading model %s (%s, %s)", record.name, record.quantization, record.path.name)
        spec = model_spec(self.config, record)
        own = ((record.name, record.settings.adapter),) if record.settings.adapter else ()  # its ADAPTER
        config = replace(self.config.engine, lora_modules=self.adapters.for_base(record.name) + own)
        if is_encoder_model(spec.ref):  # embedding and reranking models: in this process, no KV cache
            built = build_encoder_engine(spec, config)
            engine = built.engine
        elif self.attached is not None:
            built = attach_engine(spec, config, self.attached[record.name])
            engine = AsyncEngine(built.engine)
        else:
            built = build_engine(spec, config)
            engine = AsyncEngine(built.engine)
        took = time.perf_counter() - t0
        log.info("loaded model %s in %.2fs", record.name, took)
        return ServedModel(record.name, record, built.args, built.tokenizer, engine, time.time(), took, None,
                           sampling=model_sampling_defaults(record))

    def touch(self, served: ServedModel, keep_alive_s: float | None) -> None:
        """A request arrived with this keep_alive: it becomes the model's latest one."""
        served.keep_alive_s = keep_alive_s
        self._restart_timer(served, keep_alive_s)

    def restart_keep_alive(self, served: ServedModel) -> None:
        """A request ended: the timer restarts from the latest keep_alive, not the ending
        request's own (a keep_alive 0 sent meanwhile unloads the model after it)."""
        self._restart_timer(served, served.keep_alive_s)

    def _restart_timer(self, served: ServedModel, keep_alive_s: float | None) -> None:
        ka = self.config.keep_alive_s if keep_alive_s is None else keep_alive_s
        if self.attached is not None:
            ka = -1  # pinned
        served.expires_at = None if ka < 0 else time.time() + ka

    async def _make_room(self) -> None:
        """Unload idle models until one more fits; a busy model is never pulled from under
        its requests: the caller waits (under the load lock, so loads stay one at a time, while
        requests for loaded models go on) until one goes idle, up to SLOT_WAIT_S, then gets a 503."""
        deadline = time.monotonic() + SLOT_WAIT_S
        while len(self.served) >= self.config.max_loaded_models:
            self._slot_freed.clear()
            idle = self._idle_models()
            if idle:
                victim = min(idle, key=lambda m: m.expires_at or float("inf"))
                await self._unload(victim.name, victim, expire_when_busy=False)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise OverloadedError(
                    f"all {len(self.served)} loaded models stayed busy for {SLOT_WAIT_S:g}s "
                    f"(max_loaded_models {self.config.max_loaded_models}); retry later")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._slot_freed.wait(), min(left, SLOT_POLL_S))

    def _idle_models(self) -> list[ServedModel]:
        # A model whose lock is held is being acquired (maybe loading again, waiting for the
        # load lock this caller holds): busy too.
        return [m for m in self.served.values()
                if m.active == 0 and not self._locks.setdefault(m.name, asyncio.Lock()).locked()]

    async def unload(self, name: str, expected: ServedModel | None = None) -> bool:
        """Unload `name` (only if it is still `expected`, when given) unless requests hold it:
        then it expires now instead, so the reaper unloads it after them unless a request sets
        another keep_alive. True when it was unloaded."""
        if self.attached is not None:
            return False  # pinned: the supervisor's cores hold these models until it stops
        return await self._unload(name, expected)

    async def _unload(self, name: str, expected: ServedModel | None = None, *, expire_when_busy: bool = True,
                      expired_at: float | None = None, force: bool = False) -> bool:
        # Under the model's lock, so an acquire of the same name waits instead of loading a
        # second copy while this one shuts down, and cannot count a request on it between the
        # checks below and the shutdown (the caller's own checks ran before it waited here).
        async with self._locks.setdefault(name, asyncio.Lock()):
            served = self.served.get(name)
            if served is None or (expected is not None and served is not expected):
                return False
            if expired_at is not None and (served.expires_at is None or served.expires_at > expired_at):
                return False  # a request since set another keep_alive
            if served.active > 0 and not force:
                if expire_when_busy:
                    served.expires_at = time.time()
                return False
            self.served.pop(name)
            await asyncio.to_thread(served.engine.shutdown)
        log.info("unloaded model %s", name)
        return True

    async def unload_expired(self) -> None:
        now = time.time()
        for m in list(self.served.values()):
            if m.expires_at is not None and m.expires_at <= now and m.active == 0:
                await self._unload(m.name, m, expire_when_busy=False, expired_at=now)

    async def run_reaper(self, every_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            if self.attached is None:
                await self.unload_expired()
            else:
                await self.reattach_dead()

    async def reattach_dead(self) -> None:
        """Attach again to each pinned model whose core died (the supervisor restarts it), so
        /health recovers in every API process, not only in the one a request reaches."""
        for name in self.attached:
            served = self.served.get(name)
            if served is None or not served.engine.is_alive:
                try:
                    await self.acquire(name)
                except Exception as e:  # noqa: BLE001 - /health keeps saying so; tried again next round
                    log.error("attaching to the engine core of %s failed: %s", name, e)

    def healthy(self) -> bool:
        """Every loaded engine alive, and every pinned model loaded."""
        if self.attached is not None and any(name not in self.served for name in self.attached):
            return False
        return all(m.engine.is_alive for m in self.served.values())

    async def shutdown(self) -> None:
        for name in list(self.served):
            await self._unload(name, force=True)
        retired, self._retired = list(self._retired), set()
        for served in retired:
            await self._shut_down(served)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)

    def get_loaded(self, name: str) -> ServedModel | None:
        try:
            return self.served.get(self.canonical(name))
        except ModelNotFoundError:
            return None


def same_model(loaded, resolved) -> bool:
    """Whether a registry record still names the files a model was loaded from (its settings
    may differ: those apply per request)."""
    return str(loaded.path) == str(resolved.path) and loaded.digest == resolved.digest
