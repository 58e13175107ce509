"""One engine core in front of several API processes (`mlxr serve --api-servers N`, vLLM's
api-server-count): a supervisor starts the core with one channel per API process
(CoreProcess), and each API process attaches to its channel (frontend/attached_client.py)
instead of starting a core of its own. The core tags requests by channel (core_channels.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import msgspec

from mlxr.config import EngineConfig
from mlxr.engine.core.core_proc import CoreLaunch


class Attachment(msgspec.Struct, frozen=True):
    """What one API process attaches a model with: its channel to each core (one, or one per
    data-parallel replica, in rank order) and where the replicas publish their KV events."""
    channels: list[tuple[str, str]]
    events: str | None = None


def channel_addresses(directory: str, count: int) -> list[tuple[str, str]]:
    return [(f"ipc://{directory}/{i}-requests", f"ipc://{directory}/{i}-outputs") for i in range(count)]


class CoreProcess:
    """The supervisor's handle on a core serving `count` channels. It holds no socket: the API
    processes bind their channels and the core connects to them."""

    def __init__(self, factory: str, factory_kwargs: dict[str, str | None], config: EngineConfig,
                 directory: str, count: int, cpus: list[int] | None = None,
                 cuda_devices: list[str] | None = None) -> None:
        """cpus / cuda_devices: a data-parallel replica's share (engine_factory.replica_launches)."""
        self.channels = channel_addresses(directory, count)
        self._launch = msgspec.msgpack.encode(CoreLaunch(self.channels, factory, factory_kwargs, config, os.getpid()))
        self._cpus = cpus
        self._env = dict(os.environ)
        if cpus is not None:
            self._env["OMP_NUM_THREADS"] = str(len(cpus))
        if cuda_devices is not None:
            self._env["CUDA_VISIBLE_DEVICES"] = ",".join(cuda_devices)
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        # A session of its own: a terminal's Ctrl-C reaches the supervisor, which stops the API
        # processes first (their streams drain) and the core last.
        self.proc = subprocess.Popen([sys.executable, "-m", "mlxr.engine.core.core_proc"], stdin=subprocess.PIPE,
                                     start_new_session=True, env=self._env)
        if self._cpus is not None:  # before it imports torch: its thread pool sees the share
            os.sched_setaffinity(self.proc.pid, self._cpus)
        self.proc.stdin.write(self._launch)
        self.proc.stdin.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
