"""The engine core in a process of its own: `python -m mlxr.engine.core.core_proc` reads a CoreLaunch
record on stdin, builds its parts with the named factory, and serves its clients over ZMQ
(core_channels.py: requests in, outputs out, one pair per API process), msgspec-encoded. It
exits when told, on SIGTERM, or when its parent is gone, so no core outlives its server."""
from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import time

import msgspec
import zmq

from mlxr.config import EngineConfig
from mlxr.engine.core.core_channels import Channels
from mlxr.engine.core.engine_core import EngineCore
from mlxr.engine.records import (
    AbortRequests, AddRequests, CoreFailed, CoreReady, Embed, Hello, LoRACall, PromptLogprobs, Reply, Shutdown,
)

log = logging.getLogger("mlxr.engine.core")

STATS_EVERY_S = 0.1  # a snapshot rides on outputs at least this often, and whenever one finishes


class CoreLaunch(msgspec.Struct):
    channels: list[tuple[str, str]]  # (requests, outputs) ZMQ addresses per client, bound by them
    factory: str  # "module:function" returning CoreParts
    factory_kwargs: dict[str, str | None]
    config: EngineConfig
    parent_pid: int


def main() -> None:
    launch = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=CoreLaunch)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx = zmq.Context()
    channels = Channels(ctx, launch.channels)
    try:
        module, name = launch.factory.split(":")
        parts = getattr(importlib.import_module(module), name)(**launch.factory_kwargs)
        core = EngineCore(parts, launch.config)
    except Exception as e:  # noqa: BLE001 - reported to the frontend, which raises it
        log.exception("engine core failed to start")
        channels.broadcast(CoreFailed(f"{type(e).__name__}: {e}"))
        channels.close()
        return
    loop = CoreLoop(core, channels, launch.parent_pid, parts.device.type == "cuda")
    signal.signal(signal.SIGTERM, lambda *_: loop.request_stop())
    try:
        loop.run()
    finally:
        core.shutdown()
        channels.close()
        ctx.term()


class CoreLoop:
    def __init__(self, core: EngineCore, channels: Channels, parent_pid: int, on_gpu: bool = False) -> None:
        self.core, self.channels, self.parent_pid, self.on_gpu = core, channels, parent_pid, on_gpu
        self.stop = False
        self.stats_at = 0.0

    def request_stop(self) -> None:
        self.stop = True

    def run(self) -> None:
        while not self.stop and os.getppid() == self.parent_pid:
            busy = self.core.has_unfinished()
            if self.channels.poll(0 if busy else 500):
                self._take_inputs()
            if self.stop:
                continue
            if not self.core.has_unfinished():
                if busy:  # aborts took the last requests: no step will carry the news, so say it now
                    self.stats_at = time.monotonic()
                    self.channels.send_outputs([], self.core.stats())
                continue
            outs = self.core.step()
            now = time.monotonic()
            stats = None
            if now - self.stats_at > STATS_EVERY_S or any(o.finish_reason is not None for o in outs):
                stats, self.stats_at = self.core.stats(), now
            self.channels.send_outputs(outs, stats)
            if self.core.fatal is not None:
                log.error("the engine core exits: %s", self.core.fatal)
                self.channels.broadcast(CoreFailed(self.core.fatal))
                return
        if not self.stop:
            log.error("the server process %d is gone; the engine core exits", self.parent_pid)

    def _take_inputs(self) -> None:
        for channel, message in self.channels.receive():
            if isinstance(message, AddRequests):
                for r in message.requests:
                    self.core.add_request(r)
            elif isinstance(message, AbortRequests):
                self.core.abort_requests(message.request_ids)
            elif isinstance(message, Embed):
                self.channels.send(channel, _reply(message.call_id, lambda: {
                    "vector": self.core.embed(message.token_ids)}))
            elif isinstance(message, PromptLogprobs):
                self.channels.send(channel, _reply(message.call_id, lambda: {
                    "logprobs": self.core.prompt_logprobs(message.token_ids, message.top, message.first)}))
            elif isinstance(message, LoRACall):
                self.channels.send(channel, _reply(message.call_id, lambda: lora_call(self.core, message)))
            elif isinstance(message, Hello):
                self.channels.send(channel, CoreReady(self.core.stats(), self.on_gpu, os.getpid()))
            elif isinstance(message, Shutdown):
                self.stop = True
                return


def lora_call(core: EngineCore, call: LoRACall) -> dict:
    if call.op == "load":
        core.load_lora(call.name, call.path)
    elif call.op == "unload":
        core.unload_lora(call.name)
    return {"names": core.lora_names()}


def _reply(call_id: int, compute) -> Reply:
    """A call's answer, or the error it raised (handed back to the caller)."""
    try:
        return Reply(call_id, **compute())
    except Exception as e:  # noqa: BLE001 - handed back to the caller
        return Reply(call_id, error=f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
