"""How the frontend reaches the engine core: in this process (InprocClient) or in a process
of its own over ZMQ (MPClient, core_proc.py). Both speak in records.py's records."""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Protocol

import msgspec
import zmq

from mlxr.config import EngineConfig
from mlxr.engine.core_proc import CoreLaunch
from mlxr.engine.engine_core import CoreParts, EngineCore
from mlxr.engine.records import (
    AbortRequests, AddRequests, CoreFailed, CoreMessage, CoreOutputs, CoreReady, CoreStats, Embed, EngineCoreOutput,
    EngineCoreRequest, Reply, Shutdown, decoder, encode,
)
from mlxr.errors import ContextLengthError, EngineDeadError, EngineError, OverloadedError


class CoreClient(Protocol):
    max_model_len: int
    on_gpu: bool

    def add_requests(self, requests: list[EngineCoreRequest]) -> None: ...

    def abort_requests(self, request_ids: list[str]) -> None: ...

    def step(self) -> list[EngineCoreOutput]: ...

    def embed(self, token_ids: list[int]) -> list[float]: ...

    def stats(self) -> CoreStats: ...

    def alive(self) -> bool: ...

    def shutdown(self) -> None: ...


class InprocClient:
    """The core as an object of this process: a step is a call."""

    def __init__(self, parts: CoreParts, config: EngineConfig) -> None:
        self.core = EngineCore(parts, config)
        self.max_model_len = self.core.max_model_len
        self.on_gpu = parts.device.type == "cuda"

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        for r in requests:
            self.core.add_request(r)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.core.abort_requests(request_ids)

    def step(self) -> list[EngineCoreOutput]:
        return self.core.step()

    def embed(self, token_ids: list[int]) -> list[float]:
        return self.core.embed(token_ids)

    def stats(self) -> CoreStats:
        return self.core.stats()

    def alive(self) -> bool:
        return True

    def shutdown(self) -> None:
        self.core.shutdown()


class MPClient:
    """The core in its own process (core_proc.py): requests go out on one ZMQ socket, outputs
    come back on another. A core that dies raises EngineDeadError from the next call."""

    POLL_MS = 20  # step() returns empty-handed after this, so new work is taken in promptly

    def __init__(self, factory: str, factory_kwargs: dict[str, str | None], config: EngineConfig,
                 start_timeout_s: float = 900.0) -> None:
        self._dir = tempfile.mkdtemp(prefix="mlxr-core-")
        self._ctx = zmq.Context()
        self._out, self._in = self._ctx.socket(zmq.PUSH), self._ctx.socket(zmq.PULL)
        in_addr, out_addr = f"ipc://{self._dir}/requests", f"ipc://{self._dir}/outputs"
        self._out.bind(in_addr)
        self._in.bind(out_addr)
        self._decode = decoder(CoreMessage).decode
        self._buffer: list[EngineCoreOutput] = []
        self._replies: dict[int, Reply] = {}
        self._calls = itertools.count()
        self.dead: str | None = None
        launch = CoreLaunch(in_addr, out_addr, factory, factory_kwargs, config, os.getpid())
        self.proc = subprocess.Popen([sys.executable, "-m", "mlxr.engine.core_proc"], stdin=subprocess.PIPE)
        self.proc.stdin.write(msgspec.msgpack.encode(launch))
        self.proc.stdin.close()
        ready = self._wait(lambda m: isinstance(m, (CoreReady, CoreFailed)), start_timeout_s)
        if isinstance(ready, CoreFailed):
            self.shutdown()
            raise EngineDeadError(f"the engine core failed to start: {ready.error}")
        self._stats = ready.stats
        self.max_model_len = ready.stats.max_model_len
        self.on_gpu = ready.on_gpu

    @property
    def pid(self) -> int:
        return self.proc.pid

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        self._send(AddRequests(requests))

    def abort_requests(self, request_ids: list[str]) -> None:
        if self.dead is None:
            self._send(AbortRequests(request_ids))

    def step(self) -> list[EngineCoreOutput]:
        if not self._buffer:
            self._receive(self.POLL_MS)
        outputs, self._buffer = self._buffer, []
        return outputs

    def embed(self, token_ids: list[int]) -> list[float]:
        if len(token_ids) > self.max_model_len:
            raise ContextLengthError(len(token_ids), self.max_model_len)
        call_id = next(self._calls)
        self._send(Embed(call_id, token_ids))
        while call_id not in self._replies:
            self._receive(self.POLL_MS)
        reply = self._replies.pop(call_id)
        if reply.error is not None:
            kind, _, message = reply.error.partition(": ")
            raise (OverloadedError if kind == "OverloadedError" else EngineError)(message or kind)
        return reply.vector

    def stats(self) -> CoreStats:
        return self._stats

    def alive(self) -> bool:
        return self.dead is None and self.proc.poll() is None

    def shutdown(self) -> None:
        if self.proc.poll() is None:
            try:
                self._out.send(encode(Shutdown()), zmq.NOBLOCK)
                self.proc.wait(timeout=10)
            except (zmq.ZMQError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._out.close(linger=0)
        self._in.close(linger=0)
        self._ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    # --- the sockets ---------------------------------------------------------------------------
    def _send(self, message) -> None:
        self._check_alive()
        self._out.send(encode(message))

    def _check_alive(self) -> None:
        if self.dead is None and self.proc.poll() is not None:
            self.dead = f"the engine core process {self.proc.pid} exited with status {self.proc.returncode}"
        if self.dead is not None:
            raise EngineDeadError(self.dead)

    def _receive(self, timeout_ms: int) -> None:
        """Take in the messages that arrive within timeout_ms (raises if the core died)."""
        if not self._in.poll(timeout_ms):
            self._check_alive()
            return
        while True:
            try:
                self._take(self._decode(self._in.recv(zmq.NOBLOCK, copy=False).buffer))
            except zmq.Again:
                return

    def _take(self, message) -> None:
        if isinstance(message, CoreOutputs):
            self._buffer += message.outputs
            if message.stats is not None:
                self._stats = message.stats
        elif isinstance(message, Reply):
            self._replies[message.call_id] = message
        elif isinstance(message, CoreFailed):
            self.dead = f"the engine core failed: {message.error}"

    def _wait(self, done, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._in.poll(100):
                message = self._decode(self._in.recv())
                if done(message):
                    return message
            elif self.proc.poll() is not None:
                return CoreFailed(f"the process exited with status {self.proc.returncode}")
        return CoreFailed(f"not ready within {timeout_s:.0f}s")
