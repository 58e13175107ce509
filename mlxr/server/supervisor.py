"""`mlxr serve --api-servers N` (N > 1): the supervisor process. It starts one engine core per
model given at start, with one channel per API process (core_attach.CoreProcess), then N API
processes (api_worker.py) that share the HTTP port, and watches them all:

- a core that dies is restarted (its API processes fail the requests it held, say so on
  /health, and attach again); more than MAX_CORE_RESTARTS deaths within RESTART_WINDOW_S stop
  the server;
- an API process that dies stops the server (exit status 1): a service manager restarts it whole;
- SIGTERM or SIGINT stops the API processes (in-flight requests finish, up to the shutdown
  timeout), then the cores. Each child also exits by itself when the supervisor is gone."""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import msgspec

from mlxr.config import ServerConfig
from mlxr.engine.core.core_attach import Attachment, CoreProcess
from mlxr.engine_factory import core_launch, replica_launches
from mlxr.server.api_worker import WorkerLaunch, listening_socket
from mlxr.server.model_manager import model_spec

log = logging.getLogger("mlxr.server.supervisor")
MAX_CORE_RESTARTS = 3
RESTART_WINDOW_S = 60.0
WATCH_EVERY_S = 0.1


@dataclass(frozen=True)
class LogSettings:
    level: str
    format: str


def run_supervisor(config: ServerConfig, registry, shutdown_timeout_s: float, stats_every_s: float,
                   logging_: LogSettings, max_tokens_default: int = 2048) -> int:
    """Serve config.preload through config.api_servers API processes; returns the exit status."""
    # Bound, not listening: the port is ours (a clear error now if taken), and the kernel hands
    # connections only to the API processes' listening sockets.
    try:
        claim = listening_socket(config.host, config.port, listen=False)
    except OSError as e:
        log.error("cannot listen on %s:%d: %s", config.host, config.port, e)
        return 1
    if config.port == 0:  # every API process must take the one port the kernel picked
        config = dataclasses.replace(config, port=claim.getsockname()[1])
    with claim, tempfile.TemporaryDirectory(prefix="mlxr-serve-") as directory:
        cores: dict[str, list[CoreProcess]] = {}
        events: dict[str, str | None] = {}
        workers: list[subprocess.Popen] = []
        stop = _StopSignal()
        try:
            for i, name in enumerate(config.preload):
                os.mkdir(f"{directory}/{i}")
                spec = model_spec(config, registry.resolve(name))
                cores[name], events[name] = _start_cores(spec, config, f"{directory}/{i}")
            for index in range(config.api_servers):
                attached = {name: Attachment([c.channels[index] for c in replicas], events[name])
                            for name, replicas in cores.items()}
                launch = WorkerLaunch(index, config, attached, os.getpid(), logging_.level, logging_.format,
                                      shutdown_timeout_s, stats_every_s, max_tokens_default, banner=index == 0)
                workers.append(_start_worker(launch))
            log.info("supervising %d API processes (pids %s) and %d engine cores (pids %s)", len(workers),
                     [w.pid for w in workers], sum(map(len, cores.values())),
                     [c.pid for replicas in cores.values() for c in replicas])
            return _Watch(cores, workers, stop).run()
        finally:
            _stop_all(workers, cores, shutdown_timeout_s)


def _start_cores(spec, config: ServerConfig, directory: str) -> tuple[list[CoreProcess], str | None]:
    """A model's core, or its data-parallel replicas' (each on its share of the CPUs or its own
    devices, as one API process would start them), and where those publish their KV events."""
    engine = config.engine
    if engine.data_parallel_size == 1:
        return [CoreProcess(*core_launch(spec, engine), engine, directory, config.api_servers)], None
    events = engine.kv_events_endpoint or f"ipc://{directory}/kv-events"
    cores = []
    for rank, r in enumerate(replica_launches(spec, engine, events)):
        os.mkdir(f"{directory}/{rank}")
        cores.append(CoreProcess(r.factory, r.kwargs, r.config, f"{directory}/{rank}", config.api_servers,
                                 cpus=r.cpus, cuda_devices=r.cuda_devices))
    return cores, events


def _start_worker(launch: WorkerLaunch) -> subprocess.Popen:
    # A session of its own: a terminal's Ctrl-C reaches only the supervisor, which sends each
    # API process one SIGTERM (a second signal would make uvicorn drop its streams).
    proc = subprocess.Popen([sys.executable, "-m", "mlxr.server.api_worker"], stdin=subprocess.PIPE,
                            start_new_session=True)
    proc.stdin.write(msgspec.msgpack.encode(launch))
    proc.stdin.close()
    return proc


class _StopSignal:
    def __init__(self) -> None:
        self.signal: int | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._set)

    def _set(self, signum, _frame) -> None:
        self.signal = signum


class _Watch:
    def __init__(self, cores: dict[str, list[CoreProcess]], workers: list[subprocess.Popen], stop: _StopSignal) -> None:
        self.cores, self.workers, self.stop = cores, workers, stop
        self.deaths: list[float] = []

    def run(self) -> int:
        while self.stop.signal is None:
            time.sleep(WATCH_EVERY_S)
            for index, w in enumerate(self.workers):
                if w.poll() is not None:
                    log.error("API process %d (pid %d) exited with status %s; stopping the server",
                              index, w.pid, w.returncode)
                    return 1
            for name, replicas in self.cores.items():
                for core in replicas:
                    if core.exit_code() is not None and not self._restart(name, core):
                        return 1
        log.info("signal %d: stopping the API processes, then the engine cores", self.stop.signal)
        return 0

    def _restart(self, name: str, core: CoreProcess) -> bool:
        now = time.monotonic()
        self.deaths = [t for t in self.deaths if now - t < RESTART_WINDOW_S] + [now]
        if len(self.deaths) > MAX_CORE_RESTARTS:
            log.error("the engine core of %s (pid %d) exited with status %s, the %dth time within %.0fs; "
                      "stopping the server", name, core.pid, core.exit_code(), len(self.deaths), RESTART_WINDOW_S)
            return False
        log.error("the engine core of %s (pid %d) exited with status %s; starting it again", name, core.pid,
                  core.exit_code())
        core.start()
        return True


def _stop_all(workers: list[subprocess.Popen], cores: dict[str, list[CoreProcess]], shutdown_timeout_s: float) -> None:
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + shutdown_timeout_s + 5
    for w in workers:
        try:
            w.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("API process %d did not stop in time; killing it", w.pid)
            w.kill()
            w.wait()
    for replicas in cores.values():
        for core in replicas:
            core.stop()
