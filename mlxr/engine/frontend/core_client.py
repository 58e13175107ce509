"""How the frontend reaches the engine core: in this process (InprocClient), or in a process of
its own over ZMQ (core_proc.py) that this process starts (MPClient) or that a supervisor started
for several API processes (attached_client.py's AttachedClient). All speak in records.py's records."""
from __future__ import annotations

import contextlib
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
from mlxr.engine.core.core_proc import CoreLaunch, lora_call
from mlxr.engine.core.core_parts import CoreParts
from mlxr.engine.core.engine_core import EngineCore
from mlxr.engine.records import (
    AbortRequests, AddRequests, CoreFailed, CoreMessage, CoreOutputs, CoreReady, Embed, EngineCoreOutput,
    EngineCoreRequest, Hello, LoRACall, PromptLogprobs, Reply, Shutdown, TokenLogprob, decoder, encode,
)
from mlxr.errors import (
    AdapterError, ContextLengthError, EngineDeadError, EngineError, InvalidParameterError, ModelNotFoundError,
    OverloadedError,
)
from mlxr.types import EngineStats

# A LoRA call's errors, raised again on this side by their names.
_LORA_ERRORS = {"AdapterError": AdapterError, "ModelNotFoundError": ModelNotFoundError,
                "InvalidParameterError": lambda text: InvalidParameterError("model", text.removeprefix("model: "))}


class CoreClient(Protocol):
    max_model_len: int
    on_gpu: bool

    def add_requests(self, requests: list[EngineCoreRequest]) -> None: ...

    def abort_requests(self, request_ids: list[str]) -> None: ...

    def step(self) -> list[EngineCoreOutput]: ...

    def embed(self, token_ids: list[int]) -> list[float]: ...

    def prompt_logprobs(self, token_ids: list[int], top: int, first: int = 0) -> list[TokenLogprob]: ...

    def stats(self) -> EngineStats: ...

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

    def prompt_logprobs(self, token_ids: list[int], top: int, first: int = 0) -> list[TokenLogprob]:
        return self.core.prompt_logprobs(token_ids, top, first)

    def lora(self, op: str, name: str = "", path: str = "") -> list[str]:
        """Load, unload or list ("list") LoRA adapters; the names loaded after it."""
        return lora_call(self.core, LoRACall(0, op, name, path))["names"]

    def stats(self) -> EngineStats:
        return self.core.stats()

    def alive(self) -> bool:
        return True

    def shutdown(self) -> None:
        self.core.shutdown()


class ZmqClient:
    """One channel to a core process: this side binds a PUSH socket for requests and a PULL
    socket for outputs; the core connects to both. A core that dies raises EngineDeadError
    from the next call. Subclasses say how the core is started and watched (_exit_status)."""

    POLL_MS = 20  # step() returns empty-handed after this, so new work is taken in promptly

    def __init__(self, requests_address: str, outputs_address: str) -> None:
        self._ctx = zmq.Context()
        self._out, self._in = self._ctx.socket(zmq.PUSH), self._ctx.socket(zmq.PULL)
        self._out.bind(requests_address)
        self._in.bind(outputs_address)
        self._decode = decoder(CoreMessage).decode
        self._buffer: list[EngineCoreOutput] = []
        self._replies: dict[int, Reply] = {}
        self._calls = itertools.count()
        self.dead: str | None = None

    def _greet(self, start_timeout_s: float) -> CoreReady:
        """Ask the core for its CoreReady (answered once it has loaded) and wait for it."""
        deadline = time.monotonic() + start_timeout_s
        ready = self._say_hello(deadline)
        if ready is None:
            ready = self._wait(lambda m: isinstance(m, (CoreReady, CoreFailed)), deadline - time.monotonic())
        if isinstance(ready, CoreFailed):
            self.close()
            raise EngineDeadError(f"the engine core failed to start: {ready.error}")
        self._stats = ready.stats
        self.max_model_len = ready.stats.max_model_len
        self.on_gpu = ready.on_gpu
        return ready

    def _say_hello(self, deadline: float) -> CoreFailed | None:
        """A bound PUSH socket holds a message until a peer connects: a core that dies before
        connecting must not leave this send waiting for ever."""
        while True:
            try:
                self._out.send(encode(Hello()), zmq.NOBLOCK)
                return None
            except zmq.Again:
                if (status := self._exit_status()) is not None:
                    return CoreFailed(status)
                if time.monotonic() > deadline:
                    return CoreFailed("it did not connect in time")
                time.sleep(0.01)

    def _exit_status(self) -> str | None:
        """None while the core runs (or may still come up); what happened once it is gone."""
        raise NotImplementedError

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        self._send(AddRequests(requests))

    def abort_requests(self, request_ids: list[str]) -> None:
        # A core that died since the last call has nothing left to abort: finding that out here
        # must not raise (a frontend failing its requests one abort at a time would stop at the first).
        if self.dead is None:
            with contextlib.suppress(EngineDeadError):
                self._send(AbortRequests(request_ids))

    def step(self, timeout_ms: int | None = None) -> list[EngineCoreOutput]:
        if not self._buffer:
            self._receive(self.POLL_MS if timeout_ms is None else timeout_ms)
        outputs, self._buffer = self._buffer, []
        return outputs

    def embed(self, token_ids: list[int]) -> list[float]:
        return self._call(token_ids, lambda call_id: Embed(call_id, token_ids)).vector

    def prompt_logprobs(self, token_ids: list[int], top: int, first: int = 0) -> list[TokenLogprob]:
        return self._call(token_ids, lambda call_id: PromptLogprobs(call_id, token_ids, top, first)).logprobs

    def lora(self, op: str, name: str = "", path: str = "") -> list[str]:
        call_id = next(self._calls)
        self._send(LoRACall(call_id, op, name, path))
        while call_id not in self._replies:
            self._receive(self.POLL_MS)
        reply = self._replies.pop(call_id)
        if reply.error is not None:
            kind, _, text = reply.error.partition(": ")
            raise _LORA_ERRORS.get(kind, EngineError)(text or kind)
        return reply.names or []

    def _call(self, token_ids: list[int], message) -> Reply:
        """Send a prompt's call between steps and wait for its reply."""
        if len(token_ids) > self.max_model_len:
            raise ContextLengthError(len(token_ids), self.max_model_len)
        call_id = next(self._calls)
        self._send(message(call_id))
        while call_id not in self._replies:
            self._receive(self.POLL_MS)
        reply = self._replies.pop(call_id)
        if reply.error is not None:
            kind, _, text = reply.error.partition(": ")
            raise (OverloadedError if kind == "OverloadedError" else EngineError)(text or kind)
        return reply

    def stats(self) -> EngineStats:
        # An idle frontend's engine thread does not read; under --api-servers the core keeps
        # sending snapshots (other API processes' requests run): take them in, so the figures
        # are fresh and the queue stays short. Outputs read here wait in the buffer for step().
        if self.dead is None:
            with contextlib.suppress(EngineDeadError):
                self._receive(0)
        return self._stats

    def alive(self) -> bool:
        return self.death() is None

    def death(self) -> str | None:
        """Why the core is gone (once known, kept), or None while it runs."""
        if self.dead is None:
            self.dead = self._exit_status()
        return self.dead

    @property
    def outputs_socket(self) -> zmq.Socket:
        """What a client of several cores polls (data parallelism: dp_client.py)."""
        return self._in

    def close(self) -> None:
        self._out.close(linger=0)
        self._in.close(linger=0)
        self._ctx.term()

    # --- the sockets ---------------------------------------------------------------------------
    def _send(self, message) -> None:
        self._check_alive()
        self._out.send(encode(message))

    def _check_alive(self) -> None:
        if self.dead is None:
            self.dead = self._exit_status()
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
            elif (status := self._exit_status()) is not None:
                return CoreFailed(status)
        return CoreFailed(f"not ready within {timeout_s:.0f}s")


class MPClient(ZmqClient):
    """The core in a process this client starts and stops (core_proc.py)."""

    def __init__(self, factory: str, factory_kwargs: dict[str, str | None], config: EngineConfig,
                 start_timeout_s: float = 900.0, cpus: list[int] | None = None,
                 cuda_devices: list[str] | None = None) -> None:
        """cpus: the CPUs the core may run on (a data-parallel replica's share), its threads one
        each; cuda_devices: the devices it (and its tensor-parallel workers) may see."""
        self._dir = tempfile.mkdtemp(prefix="mlxr-core-")
        channel = (f"ipc://{self._dir}/requests", f"ipc://{self._dir}/outputs")
        super().__init__(*channel)
        launch = CoreLaunch([channel], factory, factory_kwargs, config, os.getpid())
        env = dict(os.environ)
        if cpus is not None:
            env["OMP_NUM_THREADS"] = str(len(cpus))
        if cuda_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(cuda_devices)
        self.proc = subprocess.Popen([sys.executable, "-m", "mlxr.engine.core.core_proc"], stdin=subprocess.PIPE,
                                     env=env)
        if cpus is not None:  # before it imports torch (a second or more): its thread pool sees the share
            os.sched_setaffinity(self.proc.pid, cpus)
        self.proc.stdin.write(msgspec.msgpack.encode(launch))
        self.proc.stdin.close()
        try:
            self._greet(start_timeout_s)
        except EngineDeadError:
            self.shutdown()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _exit_status(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"the engine core process {self.proc.pid} exited with status {self.proc.returncode}"

    def shutdown(self) -> None:
        if self.proc.poll() is None:
            try:
                self._out.send(encode(Shutdown()), zmq.NOBLOCK)
                self.proc.wait(timeout=10)
            except (zmq.ZMQError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        if not self._ctx.closed:
            self.close()
        shutil.rmtree(self._dir, ignore_errors=True)
