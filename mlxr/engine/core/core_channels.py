"""The engine core's side of its client channels: one pair of ZMQ sockets (requests in,
outputs out) per API process in front of the core (`mlxr serve --api-servers N`).

With several channels, two API processes may use the same request id, so the core knows each
request as "<channel>:<id>" and strips the tag from each output as it sends it back on the
channel it came from. Statistics ride to every channel. With one channel nothing is tagged."""
from __future__ import annotations

from collections.abc import Iterator

import zmq

from mlxr.engine.records import (
    AbortRequests, AddRequests, CoreInput, CoreOutputs, EngineCoreOutput, decoder, encode,
)
from mlxr.types import EngineStats

TAG_SEP = ":"


class Channels:
    def __init__(self, ctx: zmq.Context, addresses: list[tuple[str, str]]) -> None:
        """addresses: (requests, outputs) per channel, bound by the clients; the core connects."""
        if not addresses:
            raise ValueError("the engine core needs at least one client channel")
        self.inputs: list[zmq.Socket] = []
        self.outputs: list[zmq.Socket] = []
        self.poller = zmq.Poller()
        for requests, outputs in addresses:
            inp, out = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
            inp.connect(requests)
            out.connect(outputs)
            self.poller.register(inp, zmq.POLLIN)
            self.inputs.append(inp)
            self.outputs.append(out)
        self.tagged = len(addresses) > 1
        self._decode = decoder(CoreInput).decode

    def poll(self, timeout_ms: int) -> bool:
        """Whether a message waits on any channel (waiting up to timeout_ms for one)."""
        if len(self.inputs) == 1:
            return bool(self.inputs[0].poll(timeout_ms))
        return bool(self.poller.poll(timeout_ms))

    def receive(self) -> Iterator[tuple[int, object]]:
        """(channel, message) for every waiting message, request ids already tagged."""
        for channel, sock in enumerate(self.inputs):
            while True:
                try:
                    message = self._decode(sock.recv(zmq.NOBLOCK, copy=False).buffer)
                except zmq.Again:
                    break
                yield channel, self._tag(channel, message)

    def _tag(self, channel: int, message):
        if not self.tagged:
            return message
        if isinstance(message, AddRequests):
            for r in message.requests:
                r.request_id = f"{channel}{TAG_SEP}{r.request_id}"
        elif isinstance(message, AbortRequests):
            message.request_ids = [f"{channel}{TAG_SEP}{rid}" for rid in message.request_ids]
        return message

    def send_outputs(self, outputs: list[EngineCoreOutput], stats: EngineStats | None) -> None:
        """Each output to its channel; a stats snapshot to every channel."""
        if not self.tagged:
            if outputs or stats is not None:
                self.outputs[0].send(encode(CoreOutputs(outputs, stats)), copy=False)
            return
        routed: list[list[EngineCoreOutput]] = [[] for _ in self.outputs]
        for o in outputs:
            channel, _, o.request_id = o.request_id.partition(TAG_SEP)
            routed[int(channel)].append(o)
        for sock, mine in zip(self.outputs, routed):
            if mine:
                sock.send(encode(CoreOutputs(mine, stats)), copy=False)
            elif stats is not None:
                self._send_snapshot(sock, stats)

    @staticmethod
    def _send_snapshot(sock: zmq.Socket, stats: EngineStats) -> None:
        """A snapshot alone never waits: an API process that has not read for a while (its
        engine thread sleeps while it has no requests) would stall the core for every other
        one once its queue filled. Dropped then; a later snapshot supersedes it anyway."""
        try:
            sock.send(encode(CoreOutputs([], stats)), zmq.NOBLOCK, copy=False)
        except zmq.Again:
            pass

    def send(self, channel: int, record) -> None:
        self.outputs[channel].send(encode(record))

    def broadcast(self, record) -> None:
        data = encode(record)
        for sock in self.outputs:
            sock.send(data)

    def close(self) -> None:
        for sock in self.outputs:
            sock.close(linger=1000)
        for sock in self.inputs:
            sock.close(linger=0)
