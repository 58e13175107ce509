"""One engine core in front of several API processes (`mlxr serve --api-servers N`, vLLM's
api-server-count): a supervisor starts the core with one channel per API process
(CoreProcess), and each API process attaches to its channel (AttachedClient) instead of
starting a core of its own. The core tags requests by channel (core_channels.py)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import msgspec

from mlxr.config import EngineConfig
from mlxr.engine.frontend.core_client import ZmqClient
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


class ProcessWatch:
    """Whether a process that is not our child has exited (a pidfd: no pid reuse, and a zombie
    counts as gone; /proc where pidfds are missing)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = None
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._gone = True
            return
        except (AttributeError, OSError):
            pass
        self._gone = False

    def exited(self) -> bool:
        if not self._gone:
            self._gone = self._check()
        return self._gone

    def _check(self) -> bool:
        if self._fd is not None:
            return bool(select.select([self._fd], [], [], 0)[0])
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        return state in ("Z", "X")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class AttachedClient(ZmqClient):
    """An API process's channel to a core the supervisor started; shutting it down leaves the
    core running for the other API processes."""

    def __init__(self, requests_address: str, outputs_address: str, start_timeout_s: float = 900.0) -> None:
        self._watch: ProcessWatch | None = None  # known once the core answers
        super().__init__(requests_address, outputs_address)
        ready = self._greet(start_timeout_s)
        self._watch = ProcessWatch(ready.pid)

    @property
    def pid(self) -> int:
        return self._watch.pid if self._watch else 0

    def _exit_status(self) -> str | None:
        # Before its answer the core may still be loading or restarting: the supervisor, not
        # this process, decides when it has failed (and exits, which stops this process).
        if self._watch is None or not self._watch.exited():
            return None
        return f"the engine core process {self._watch.pid} exited"

    def shutdown(self) -> None:
        if not self._ctx.closed:
            self.close()
        if self._watch is not None:
            self._watch.close()
