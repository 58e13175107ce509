"""Data parallelism (`--data-parallel-size N`, `LLM(data_parallel_size=N)`): N engine cores,
each a process of its own with its own KV cache (on the CPU pinned to its share of the CPUs, on
CUDA its own device), behind one frontend. It speaks the CoreClient protocol, so LLMEngine and
the server see one core: each request goes to a replica chosen by dp_placement.py (prefix
affinity from the replicas' KV events, then load). A replica that dies fails only the requests
it held and is started again in the background (MAX_RESTARTS within RESTART_WINDOW_S)."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import zmq

from mlxr.config import offset_port
from mlxr.engine.frontend.core_client import ZmqClient
from mlxr.engine.frontend.dp_placement import Placement
from mlxr.engine.records import EngineCoreOutput, EngineCoreRequest, TokenLogprob
from mlxr.errors import EngineDeadError
from mlxr.types import EngineStats

log = logging.getLogger(__name__)

MAX_RESTARTS = 3
RESTART_WINDOW_S = 60.0
POLL_MS = 20
# EngineStats' counters, summed over replicas and kept across a replica's restart.
COUNTERS = ("prefix_cache_queried_tokens", "prefix_cache_hit_tokens", "num_preemptions", "runtime_compiles",
            "spec_num_drafts", "spec_num_draft_tokens", "spec_num_accepted_tokens", "jump_forward_drafts",
            "jump_forward_draft_tokens", "jump_forward_accepted_tokens")
GAUGES = ("num_requests_running", "num_requests_waiting", "num_requests_swapped", "kv_blocks_total",
          "kv_blocks_used", "kv_blocks_cached", "device_bytes")


@dataclass
class Replica:
    rank: int
    client: ZmqClient | None  # None while it restarts
    events: zmq.Socket
    load: dict[str, int] = field(default_factory=dict)  # request id -> its tokens (prompt and sampled)
    restarts: list[float] = field(default_factory=list)  # when it died, recently
    last: EngineStats | None = None
    gone: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))  # counts of its past lives
    restarting: threading.Thread | None = None
    started: ZmqClient | None = None  # a restart's new client, taken up by the engine thread


class DPClient:
    def __init__(self, launch: Callable[[int], ZmqClient], size: int, block_size: int, events_endpoint: str,
                 on_shutdown: Callable[[], None] = lambda: None) -> None:
        """launch(rank) starts replica rank's core, which publishes its KV events at
        offset_port(events_endpoint, rank); on_shutdown runs once every core has stopped."""
        self._launch, self._ctx, self._on_shutdown = launch, zmq.Context.instance(), on_shutdown
        self.placement = Placement(size, block_size)
        self.replicas = [Replica(r, None, self._subscribe(events_endpoint, r)) for r in range(size)]
        with ThreadPoolExecutor(size) as pool:  # the cores load their weights at the same time
            started = list(pool.map(self._try_launch, range(size)))
        if any(isinstance(c, Exception) for c in started):
            for c in started:
                if not isinstance(c, Exception):
                    c.shutdown()
            for r in self.replicas:
                r.events.close()
            on_shutdown()
            raise next(c for c in started if isinstance(c, Exception))
        for replica, client in zip(self.replicas, started):
            replica.client = client
        self.max_model_len = min(c.max_model_len for c in started)
        self.on_gpu = started[0].on_gpu
        self._owner: dict[str, int] = {}
        self._failed: list[EngineCoreOutput] = []  # a dead replica's requests, failed at the next step

    def _try_launch(self, rank: int) -> ZmqClient | Exception:
        try:
            return self._launch(rank)
        except Exception as e:  # noqa: BLE001 - raised by the constructor after the others stop
            return e

    def _subscribe(self, endpoint: str, rank: int) -> zmq.Socket:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(offset_port(endpoint, rank))
        return sub

    # --- requests ------------------------------------------------------------------------------
    def _loads(self) -> list[int | None]:
        return [sum(r.load.values()) if r.client is not None else None for r in self.replicas]

    def _reap_dead(self) -> None:
        """Retire the replicas whose core is gone before anything is placed or reported: an idle
        engine does not step, so a core killed meanwhile would take the next request with it."""
        for replica in self.replicas:
            why = replica.client.death() if replica.client is not None else None
            if why is not None:
                self._failed += self._died(replica, why)

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        self._adopt_restarted()
        self._reap_dead()
        self._take_events()
        for request in requests:
            loads = self._loads()
            if all(load is None for load in loads):
                raise EngineDeadError("every data-parallel engine core is down (restarting)")
            rank, _ = self.placement.choose(request.prompt_token_ids, loads)
            replica = self.replicas[rank]
            replica.load[request.request_id] = len(request.prompt_token_ids)
            self._owner[request.request_id] = rank
            try:
                replica.client.add_requests([request])
            except EngineDeadError as e:  # it died just now: the request fails with it at the next step
                log.error("data-parallel replica %d: %s", rank, e)

    def abort_requests(self, request_ids: list[str]) -> None:
        by_rank: dict[int, list[str]] = {}
        for rid in request_ids:
            rank = self._owner.get(rid)
            if rank is not None:
                by_rank.setdefault(rank, []).append(rid)
        for rank, ids in by_rank.items():
            client = self.replicas[rank].client
            if client is not None:
                client.abort_requests(ids)

    def step(self) -> list[EngineCoreOutput]:
        self._adopt_restarted()
        poller = zmq.Poller()
        for r in self.replicas:
            if r.client is not None:
                poller.register(r.client.outputs_socket, zmq.POLLIN)
            poller.register(r.events, zmq.POLLIN)
        poller.poll(POLL_MS)
        self._take_events()
        outputs, self._failed = self._failed, []
        for replica in self.replicas:
            if replica.client is None:
                continue
            try:
                outputs += self._landed(replica, replica.client.step(0))
            except EngineDeadError as e:
                outputs += self._died(replica, str(e))
        return outputs

    def _landed(self, replica: Replica, outputs: list[EngineCoreOutput]) -> list[EngineCoreOutput]:
        for out in outputs:
            if out.finished:
                replica.load.pop(out.request_id, None)
                self._owner.pop(out.request_id, None)
            elif out.request_id in replica.load:
                replica.load[out.request_id] += len(out.new_token_ids)
        return outputs

    def _take_events(self) -> None:
        for replica in self.replicas:
            while True:
                try:
                    _topic, _seq, payload = replica.events.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.placement.take_events(replica.rank, payload)

    # --- a replica's death and restart ---------------------------------------------------------
    def _died(self, replica: Replica, why: str) -> list[EngineCoreOutput]:
        """Fail the requests it held, forget its blocks, start it again (unless it keeps dying)."""
        log.error("data-parallel replica %d died (%s); failing its %d requests", replica.rank, why, len(replica.load))
        failed = [EngineCoreOutput(rid, finish_reason="error", error=why) for rid in replica.load]
        for rid in replica.load:
            self._owner.pop(rid, None)
        replica.load.clear()
        self._retire(replica)
        now = time.monotonic()
        replica.restarts = [t for t in replica.restarts if now - t < RESTART_WINDOW_S] + [now]
        if len(replica.restarts) > MAX_RESTARTS:
            log.error("data-parallel replica %d died %d times in %.0f s; it stays down",
                      replica.rank, len(replica.restarts), RESTART_WINDOW_S)
        else:
            replica.restarting = threading.Thread(target=self._restart, args=(replica,), daemon=True,
                                                  name=f"mlxr-dp-restart-{replica.rank}")
            replica.restarting.start()
        return failed

    def _retire(self, replica: Replica) -> None:
        if replica.last is not None:
            for f in COUNTERS:
                replica.gone[f] += getattr(replica.last, f)
        replica.last = None
        client, replica.client = replica.client, None
        self.placement.indexes[replica.rank].clear()
        client.shutdown()

    def _restart(self, replica: Replica) -> None:
        try:
            replica.started = self._launch(replica.rank)
        except Exception:  # noqa: BLE001 - it stays down; /health and the metrics say so
            log.exception("data-parallel replica %d did not start again", replica.rank)

    def _adopt_restarted(self) -> None:
        for replica in self.replicas:
            if replica.started is not None:
                replica.client, replica.started, replica.restarting = replica.started, None, None
                log.info("data-parallel replica %d is back", replica.rank)

    # --- between steps -------------------------------------------------------------------------
    def _least_loaded(self) -> ZmqClient:
        loads = self._loads()
        up = [r for r, load in enumerate(loads) if load is not None]
        if not up:
            raise EngineDeadError("every data-parallel engine core is down (restarting)")
        return self.replicas[min(up, key=lambda r: loads[r])].client

    def embed(self, token_ids: list[int]) -> list[float]:
        return self._least_loaded().embed(token_ids)

    def prompt_logprobs(self, token_ids: list[int], top: int, first: int = 0) -> list[TokenLogprob]:
        return self._least_loaded().prompt_logprobs(token_ids, top, first)

    def lora(self, op: str, name: str = "", path: str = "") -> list[str]:
        """Every replica loads (unloads) the adapter; a replica restarted since has the start's ones."""
        names = [r.client.lora(op, name, path) for r in self.replicas if r.client is not None]
        if not names:
            raise EngineDeadError("every data-parallel engine core is down (restarting)")
        return names[0]

    # --- figures -------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        self._adopt_restarted()  # an idle engine does not step: a scrape or /health takes a restarted core in
        self._reap_dead()  # ... and notices a dead one
        per, total = {}, dict.fromkeys(COUNTERS + GAUGES, 0)
        for replica in self.replicas:
            if replica.client is not None:
                replica.last = replica.client.stats()
            s = replica.last
            counts = {f: replica.gone[f] + (getattr(s, f) if s is not None else 0) for f in COUNTERS}
            for f in COUNTERS:
                total[f] += counts[f]
            for f in GAUGES:
                total[f] += getattr(s, f) if s is not None else 0
            per[str(replica.rank)] = self._replica_figures(replica, s, counts)
        return EngineStats(**total, max_model_len=self.max_model_len, data_parallel=per,
                           kv_tiers=_summed([r.last.kv_tiers for r in self.replicas if r.last is not None]))

    def _replica_figures(self, replica: Replica, s: EngineStats | None, counts: dict[str, int]) -> dict[str, int]:
        return {"up": int(replica.client is not None), "restarts": len(replica.restarts),
                "pid": getattr(replica.client, "pid", 0) if replica.client is not None else 0,
                "running": s.num_requests_running if s else 0, "waiting": s.num_requests_waiting if s else 0,
                "load_tokens": sum(replica.load.values()), "kv_blocks_used": s.kv_blocks_used if s else 0,
                "kv_blocks_total": s.kv_blocks_total if s else 0,
                "prefix_hit_tokens": counts["prefix_cache_hit_tokens"],
                "prefix_queried_tokens": counts["prefix_cache_queried_tokens"],
                "blocks_indexed": len(self.placement.indexes[replica.rank].blocks),
                **{f"placed_{reason}": n for reason, n in self.placement.counts[replica.rank].items()}}

    def alive(self) -> bool:
        """While any replica runs or is being started again."""
        return any(r.client is not None or r.started is not None
                   or (r.restarting is not None and r.restarting.is_alive()) for r in self.replicas)

    def pids(self) -> list[int | None]:
        return [getattr(r.client, "pid", None) if r.client is not None else None for r in self.replicas]

    def shutdown(self) -> None:
        for replica in self.replicas:
            if replica.restarting is not None:
                replica.restarting.join(timeout=60)
            for client in (replica.client, replica.started):
                if client is not None:
                    client.shutdown()
            replica.client = replica.started = None
            replica.events.close()
        self._on_shutdown()


def _summed(tiers: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    """The replicas' KV tier figures added up, tier by tier."""
    out: dict[str, dict[str, int]] = {}
    for figures in tiers:
        for tier, values in figures.items():
            into = out.setdefault(tier, {})
            for key, value in values.items():
                into[key] = into.get(key, 0) + value
    return out
