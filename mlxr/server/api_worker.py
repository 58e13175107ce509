"""One API process of `mlxr serve --api-servers N`: `python -m mlxr.server.api_worker` reads a
WorkerLaunch on stdin (msgspec), listens on the server's port beside its siblings
(SO_REUSEPORT: the kernel spreads connections over the N processes) and serves the HTTP app
with its models attached to the engine cores the supervisor started. It stops gracefully on
SIGTERM, and by itself when the supervisor is gone."""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import msgspec

from mlxr.config import ServerConfig
from mlxr.engine.core.core_attach import Attachment

log = logging.getLogger("mlxr.server.api_worker")
BACKLOG = 4096  # a burst of hundreds of streams connects at once


class WorkerLaunch(msgspec.Struct):
    index: int
    config: ServerConfig
    channels: dict[str, Attachment]  # model name -> this process's channels to its core(s)
    supervisor_pid: int
    log_level: str
    log_format: str
    shutdown_timeout_s: float
    stats_every_s: float
    max_tokens_default: int = 2048  # reply_budget.DEFAULT_MAX_TOKENS (not imported: FastAPI)
    banner: bool = False  # print the start-up banner when ready (one process of the N)


def listening_socket(host: str, port: int, listen: bool = True) -> socket.socket:
    """A TCP socket on (host, port) that shares the port with its siblings (same user only)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
        if listen:
            sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


def watch_supervisor(pid: int, grace_s: float, every_s: float = 0.5) -> None:
    """SIGTERM to this process once its supervisor is gone (killed, say), and an exit after
    grace_s if the graceful stop hangs (a thread still waiting for a core): no API process
    outlives it."""
    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(every_s)
        log.error("the supervisor %d is gone; this API process stops", pid)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(1)

    threading.Thread(target=watch, name="mlxr-supervisor-watch", daemon=True).start()


def _server_class(base: type) -> type:
    """uvicorn's server that, told to stop, first fails the attaches waiting for a core: the
    graceful shutdown waits for in-flight requests, and no core comes for those any more."""
    from mlxr.engine.frontend.attached_client import stop_attaching

    class StoppingServer(base):
        def handle_exit(self, sig, frame) -> None:
            stop_attaching()
            super().handle_exit(sig, frame)

    return StoppingServer


def main() -> int:
    import uvicorn

    from mlxr.registry import Registry
    from mlxr.server.app import create_app
    from mlxr.server.logs import setup_logging

    launch = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=WorkerLaunch)
    setup_logging(launch.log_level, launch.log_format)
    watch_supervisor(launch.supervisor_pid, launch.shutdown_timeout_s + 5)
    config = launch.config
    ready = None
    if launch.banner:
        from mlxr.server.banner import print_banner

        ready = lambda served: print_banner(config, served, launch.max_tokens_default)  # noqa: E731
    app = create_app(config, Registry(Path(config.home)), launch.stats_every_s, launch.channels, launch.index,
                     launch.max_tokens_default, ready)
    sock = listening_socket(config.host, config.port)
    server = _server_class(uvicorn.Server)(uvicorn.Config(app, log_config=None, access_log=False,
                                                          timeout_graceful_shutdown=launch.shutdown_timeout_s))
    log.info("API server %d of %d (pid %d) listening on %s:%d", launch.index, config.api_servers, os.getpid(),
             config.host, config.port)
    server.run(sockets=[sock])
    return 0 if server.started else 3


if __name__ == "__main__":
    sys.exit(main())
