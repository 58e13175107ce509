"""The engine core in a process of its own: `python -m mlxr.engine.core_proc` reads a CoreLaunch
record on stdin, builds its parts with the named factory, and serves the frontend over two ZMQ
sockets (requests in, outputs out), msgspec-encoded. It exits when told, or when its parent
is gone, so no core outlives its server."""
from __future__ import annotations

import importlib
import logging
import os
import sys
import time

import msgspec
import zmq

from mlxr.config import EngineConfig
from mlxr.engine.engine_core import EngineCore
from mlxr.engine.records import (
    AbortRequests, AddRequests, CoreFailed, CoreInput, CoreOutputs, CoreReady, Embed, Reply, Shutdown, decoder, encode,
)

log = logging.getLogger("mlxr.engine.core")

STATS_EVERY_S = 0.1  # a snapshot rides on outputs at least this often, and whenever one finishes


class CoreLaunch(msgspec.Struct):
    input_address: str
    output_address: str
    factory: str  # "module:function" returning CoreParts
    factory_kwargs: dict[str, str | None]
    config: EngineConfig
    parent_pid: int


def main() -> None:
    launch = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=CoreLaunch)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx = zmq.Context()
    inputs, outputs = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    inputs.connect(launch.input_address)
    outputs.connect(launch.output_address)
    try:
        module, name = launch.factory.split(":")
        parts = getattr(importlib.import_module(module), name)(**launch.factory_kwargs)
        core = EngineCore(parts, launch.config)
    except Exception as e:  # noqa: BLE001 - reported to the frontend, which raises it
        log.exception("engine core failed to start")
        outputs.send(encode(CoreFailed(f"{type(e).__name__}: {e}")))
        return
    outputs.send(encode(CoreReady(core.stats(), parts.device.type == "cuda")))
    try:
        CoreLoop(core, inputs, outputs, launch.parent_pid).run()
    finally:
        core.shutdown()
        outputs.close(linger=1000)
        inputs.close(linger=0)
        ctx.term()


class CoreLoop:
    def __init__(self, core: EngineCore, inputs: zmq.Socket, outputs: zmq.Socket, parent_pid: int) -> None:
        self.core, self.inputs, self.outputs, self.parent_pid = core, inputs, outputs, parent_pid
        self.decode = decoder(CoreInput).decode
        self.stop = False
        self.stats_at = 0.0

    def run(self) -> None:
        while not self.stop and os.getppid() == self.parent_pid:
            busy = self.core.has_unfinished()
            if self.inputs.poll(0 if busy else 500):
                self._take_inputs()
            if self.stop or not self.core.has_unfinished():
                continue
            outs = self.core.step()
            now = time.monotonic()
            stats = None
            if now - self.stats_at > STATS_EVERY_S or any(o.finish_reason is not None for o in outs):
                stats, self.stats_at = self.core.stats(), now
            if outs or stats is not None:
                self.outputs.send(encode(CoreOutputs(outs, stats)), copy=False)
            if self.core.fatal is not None:
                log.error("the engine core exits: %s", self.core.fatal)
                self.outputs.send(encode(CoreFailed(self.core.fatal)))
                return
        if not self.stop:
            log.error("the server process %d is gone; the engine core exits", self.parent_pid)

    def _take_inputs(self) -> None:
        while True:
            try:
                message = self.decode(self.inputs.recv(zmq.NOBLOCK, copy=False).buffer)
            except zmq.Again:
                return
            if isinstance(message, AddRequests):
                for r in message.requests:
                    self.core.add_request(r)
            elif isinstance(message, AbortRequests):
                self.core.abort_requests(message.request_ids)
            elif isinstance(message, Embed):
                self.outputs.send(encode(self._embed(message)))
            elif isinstance(message, Shutdown):
                self.stop = True
                return

    def _embed(self, message: Embed) -> Reply:
        try:
            return Reply(message.call_id, vector=self.core.embed(message.token_ids))
        except Exception as e:  # noqa: BLE001 - handed back to the caller
            return Reply(message.call_id, error=f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
