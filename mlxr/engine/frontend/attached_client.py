"""An API process's side of a core that a supervisor started for several API processes
(`mlxr serve --api-servers N`; core/core_attach.py starts it): the process attaches to its own
channel (AttachedClient) and watches the core's process, which is not its child (ProcessWatch)."""
from __future__ import annotations

import os
import select
import threading
from pathlib import Path

from mlxr.engine.frontend.core_client import ZmqClient

# Set once this API process stops: the supervisor starts no core for it any more, so an attach
# still waiting for one (a request that came in while a dead core was being replaced) would wait
# out the whole graceful shutdown. Module-wide: a signal handler sets it, any thread reads it.
_STOPPING = threading.Event()


def stop_attaching() -> None:
    """Make every attach still waiting for its core, and every later one, fail at once."""
    _STOPPING.set()


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
        if self._watch is None:
            return "this API process is stopping" if _STOPPING.is_set() else None
        if not self._watch.exited():
            return None
        return f"the engine core process {self._watch.pid} exited"

    def shutdown(self) -> None:
        if not self._ctx.closed:
            self.close()
        if self._watch is not None:
            self._watch.close()
