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


def channel_addresses(directory: str, count: int) -> list[tuple[str, str]]:
    return [(f"ipc://{directory}/{i}-requests", f"ipc://{directory}/{i}-outputs") for i in range(count)]


class CoreProcess:
    """The supervisor's handle on a core serving `count` channels. It holds no socket: the API
    processes bind their channels and the core connects to them."""

    def __init__(self, factory: str, factory_kwargs: dict[str, str | None], config: EngineConfig,
                 directory: str, count: int) -> None:
        self.channels = channel_addresses(directory, count)
        self._launch = msgspec.msgpack.encode(CoreLaunch(self.channels, factory, factory_kwargs, config, os.getpid()))
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        # A session of its own: a terminal's Ctrl-C reaches the supervisor, which stops the API
        # processes first (their streams drain) and the core last.
        self.proc = subprocess.Popen([sys.executable, "-m", "mlxr.engine.core.core_proc"], stdin=subprocess.PIPE,
                                     start_new_session=True)
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
