"""KV-cache events for fleet routers (llm-d's indexer, Dynamo's KV router), in vLLM's wire format:
per engine step one msgspec-msgpack EventBatch [ts, events, data_parallel_rank] of tagged arrays
BlockStored / BlockRemoved / AllBlocksCleared, sent on a ZMQ PUB socket as three frames
(topic, 8-byte big-endian sequence number, payload). An optional ROUTER socket replays the last
batches from a sequence number a subscriber sends, then a -1 marker with an empty payload.

A block is named as vLLM names it by default: the last 8 bytes of its chained SHA-256
(block_manager.block_hash) as an unsigned big-endian integer. The medium says which tier holds
it: GPU for the engine's own KV cache (on the CPU too: it is the device cache), CPU for the host
tier, DISK for the disk tier (its writer thread reports a block once written and when it deletes
one). The core announces a step's events when the step ends (flush), encoding them there; a
thread sends them, so a slow network never blocks a step, and flushes what the disk writer
reported while no step runs."""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import msgspec
import zmq

from mlxr.config import EngineConfig, offset_port

log = logging.getLogger(__name__)

MEDIUM_DEVICE, MEDIUM_HOST, MEDIUM_DISK = "GPU", "CPU", "DISK"
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
MAX_QUEUED_BATCHES = 10_000  # batches waiting for the sender thread; past it a batch is dropped (counted)
REPLAY_BATCHES = 10_000  # the last batches the replay socket can send again
SEND_HWM = 100_000  # ZMQ's per-subscriber queue (messages) before it drops for a slow one


class _Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(_Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(_Event):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(_Event):
    pass


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def external_hash(h: bytes) -> int:
    """A block's name on the wire (vLLM's integer block hashes)."""
    return int.from_bytes(h[-8:], "big")


@dataclass
class _Known:
    parent: bytes | None
    tokens: tuple[int, ...]
    media: set[str]


class KVEventPublisher:
    """Collects a step's block events (the block manager's and the tiers' hooks) and publishes them."""

    def __init__(self, endpoint: str, block_size: int, rank: int = 0, topic: str = "",
                 replay_endpoint: str | None = None) -> None:
        self.block_size, self.rank = block_size, rank
        self.endpoint = offset_port(endpoint, rank)
        self.replay_endpoint = offset_port(replay_endpoint, rank) if replay_endpoint else None
        self._topic = topic.encode()
        self._known: dict[bytes, _Known] = {}  # every hash announced and still held by some medium
        self._pending: list[_Event] = []
        self._tail: tuple[bytes, str] | None = None  # (last hash, medium) of the pending BlockStored
        self._seq = 0
        self._lock = threading.Lock()  # the disk writer's thread reports too
        self.dropped_batches = 0
        self._encoder = msgspec.msgpack.Encoder()
        self._queue: queue.Queue[tuple[int, bytes] | None] = queue.Queue(MAX_QUEUED_BATCHES)
        self._ctx = zmq.Context.instance()
        self._pub, self._replay = self._bind()
        self._thread = threading.Thread(target=self._send_loop, name="mlxr-kv-events", daemon=True)
        self._thread.start()

    def _bind(self) -> tuple[zmq.Socket, zmq.Socket | None]:
        pub = self._ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, SEND_HWM)
        pub.setsockopt(zmq.LINGER, 0)
        replay = None
        try:
            pub.bind(self.endpoint)
            if self.replay_endpoint is not None:
                replay = self._ctx.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                replay.bind(self.replay_endpoint)
        except zmq.ZMQError as e:
            pub.close()
            if replay is not None:
                replay.close()
            raise OSError(f"KV events: cannot bind {self.replay_endpoint if replay else self.endpoint}: {e}") from e
        log.info("KV events published at %s (replay: %s)", self.endpoint, self.replay_endpoint or "off")
        return pub, replay

    # --- the hooks -----------------------------------------------------------------------------
    def stored(self, h: bytes, parent: bytes | None, tokens: tuple[int, ...], lora_id: int | None = None,
               medium: str = MEDIUM_DEVICE) -> None:
        with self._lock:
            self._stored(h, parent, tokens, medium, lora_id)

    def _stored(self, h: bytes, parent: bytes | None, tokens: tuple[int, ...], medium: str,
                lora_id: int | None = None) -> None:
        known = self._known.setdefault(h, _Known(parent, tokens, set()))
        if medium in known.media:
            return
        known.media.add(medium)
        last = self._pending[-1] if self._pending else None
        if (isinstance(last, BlockStored) and self._tail == (parent, medium) and parent is not None
                and last.lora_id == lora_id):
            last.block_hashes.append(external_hash(h))  # the chain goes on: one event for the run
            last.token_ids.extend(tokens)
        else:
            self._pending.append(BlockStored([external_hash(h)], None if parent is None else external_hash(parent),
                                             list(tokens), self.block_size, lora_id, medium))
        self._tail = (h, medium)

    def copied(self, h: bytes, medium: str) -> None:
        """A block already announced on another medium now also lives on this one."""
        with self._lock:
            known = self._known.get(h)
            if known is not None:
                self._stored(h, known.parent, known.tokens, medium)

    def removed(self, h: bytes, medium: str = MEDIUM_DEVICE) -> None:
        with self._lock:
            self._removed(h, medium)

    def _removed(self, h: bytes, medium: str) -> None:
        known = self._known.get(h)
        if known is None or medium not in known.media:
            return  # never announced (a restart's preload): nothing to take back
        known.media.discard(medium)
        if not known.media:
            del self._known[h]
        last = self._pending[-1] if self._pending else None
        if isinstance(last, BlockRemoved) and last.medium == medium:
            last.block_hashes.append(external_hash(h))
        else:
            self._pending.append(BlockRemoved([external_hash(h)], medium))
        self._tail = None

    def cleared(self) -> None:
        with self._lock:
            self._known.clear()
            self._pending = [AllBlocksCleared()]
            self._tail = None

    # --- publishing ----------------------------------------------------------------------------
    def flush(self) -> None:
        """The step is over: its events leave as one batch."""
        with self._lock:
            if not self._pending:
                return
            batch = EventBatch(time.time(), self._pending, self.rank)
            self._pending, self._tail = [], None
            seq, self._seq = self._seq, self._seq + 1
            try:  # under the lock: batches are queued in their numbers' order
                self._queue.put_nowait((seq, self._encoder.encode(batch)))
            except queue.Full:  # the sender is stuck; a subscriber sees the gap in the numbers
                self.dropped_batches += 1

    def _send_loop(self) -> None:
        sent: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_BATCHES)
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay(sent)
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                self.flush()  # the disk writer's reports while no step runs
                continue
            if item is None:
                break
            seq, payload = item
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            sent.append(item)
        self._pub.close()
        if self._replay is not None:
            self._replay.close()

    def _serve_replay(self, sent: deque[tuple[int, bytes]]) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("KV events: a malformed replay request (%d frames) is ignored", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in sent:
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_OF_REPLAY, b""))

    def close(self) -> None:
        """Send what is queued, then free the addresses (a restarted core binds them again)."""
        self.flush()
        self._queue.put(None)
        self._thread.join(timeout=5.0)


def make_publisher(config: EngineConfig) -> KVEventPublisher | None:
    if config.kv_events_endpoint is None:
        return None
    publisher = KVEventPublisher(config.kv_events_endpoint, config.block_size, config.data_parallel_rank,
                                 config.kv_events_topic, config.kv_events_replay_endpoint)
    publisher.cleared()  # a (re)started core holds nothing: subscribers forget what it held before
    publisher.flush()
    return publisher
