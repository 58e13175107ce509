"""KV-cache events as a fleet router reads them: a real ZMQ SUB socket decodes the stream with
vLLM's published schema (written out below as a schema, independent of MLXR's encoder), and
the block set it rebuilds after a workload that evicts from the device, host and disk tiers is
exactly the engine's own, per medium. Each stored block's hash is checked against a chained
SHA-256 the test computes from the token ids and parent the event carries."""
from __future__ import annotations

import hashlib
import socket
import time
from array import array
from typing import Any

import msgspec
import pytest
import torch
import zmq

from model_fixtures import fixture_model
from mlxr import LLM, SamplingParams


# --- vLLM's schema (vllm/distributed/kv_events.py), as a subscriber declares it ------------------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODE = msgspec.msgpack.Decoder(type=KVEventBatch)
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
BLOCK = 16
HOST_BLOCKS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last8(digest: bytes) -> int:
    return int.from_bytes(digest[-8:], "big")


class Rebuilt:
    """The engine's blocks per medium, as the events say; full digests kept to check the chain."""

    def __init__(self) -> None:
        self.media: dict[str, set[int]] = {}
        self.digest: dict[int, bytes] = {}
        self.ranks: set[int | None] = set()

    def apply(self, batch: KVEventBatch) -> None:
        self.ranks.add(batch.data_parallel_rank)
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self.media.clear()
            elif isinstance(event, BlockStored):
                self._stored(event)
            else:
                self.media.get(event.medium, set()).difference_update(event.block_hashes)

    def _stored(self, event: BlockStored) -> None:
        assert event.block_size == BLOCK and len(event.token_ids) == BLOCK * len(event.block_hashes)
        parent = None if event.parent_block_hash is None else self.digest[event.parent_block_hash]
        for i, h in enumerate(event.block_hashes):
            d = hashlib.sha256(parent or b"")
            d.update(array("q", event.token_ids[i * BLOCK:(i + 1) * BLOCK]).tobytes())
            parent = d.digest()
            assert last8(parent) == h, "a stored block's hash is not its parent's and tokens' chained SHA-256"
            self.digest[h] = parent
            self.media.setdefault(event.medium, set()).add(h)


def receive(sub: zmq.Socket, quiet_s: float = 1.0) -> list[tuple[bytes, int, bytes]]:
    frames = []
    while sub.poll(int(quiet_s * 1000)):
        topic, seq, payload = sub.recv_multipart()
        frames.append((topic, int.from_bytes(seq, "big"), payload))
    return frames


def replay(endpoint: str, start: int) -> list[tuple[int, bytes]]:
    req = zmq.Context.instance().socket(zmq.DEALER)  # many replies to one request: not REQ
    req.connect(endpoint)
    req.send_multipart((b"", start.to_bytes(8, "big")))
    out = []
    while True:
        assert req.poll(5000), "the replay socket did not answer"
        _, seq, payload = req.recv_multipart()
        if int.from_bytes(seq, "big", signed=True) == -1:
            break
        out.append((int.from_bytes(seq, "big"), payload))
    req.close(linger=0)
    return out


@pytest.fixture(scope="module")
def model() -> str:
    return str(fixture_model("tiny-llama").hf_dir)


def test_subscriber_rebuilds_the_engines_blocks(model):
    pub, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"mlxr")
    sub.connect(pub)
    llm = LLM(model, dtype=torch.float32, num_kv_blocks=20, kv_host_cache_gb=HOST_BLOCKS * 8192 / (1 << 30),
              kv_events_endpoint=pub, kv_events_replay_endpoint=rep, kv_events_topic="mlxr")
    try:
        core = llm.engine.core.core
        assert core.tiers.host.data.shape[0] == HOST_BLOCKS
        time.sleep(0.5)  # the subscription reaches the publisher
        # 12 full blocks a prompt against 20 device blocks and 8 host slots: both tiers evict,
        # and the first prompt comes back partly from the host tier.
        prompts = [[(7 * k + 3 * i) % 500 + 5 for i in range(200)] for k in range(3)]
        for prompt in prompts + prompts[:1]:
            llm.generate([prompt], GREEDY)
        frames = receive(sub)
        assert frames and {topic for topic, _, _ in frames} == {b"mlxr"}
        seqs = [seq for _, seq, _ in frames]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "sequence numbers have gaps"
        missed = replay(rep, 0)  # the start's batches may have gone before the subscription arrived
        by_seq = dict(missed)
        assert all(by_seq[seq] == payload for _, seq, payload in frames), "replay differs from the stream"
        assert [seq for seq, _ in missed] == list(range(len(missed)))
        rebuilt = Rebuilt()
        batches = [DECODE.decode(payload) for _, payload in missed]
        assert isinstance(batches[0].events[0], AllBlocksCleared)
        for batch in batches:
            rebuilt.apply(batch)
        bm, host = core.block_manager, core.tiers.host
        removed = {m for b in batches for e in b.events if isinstance(e, BlockRemoved) for m in [e.medium]}
        assert removed == {"GPU", "CPU"}, "the workload should evict from both tiers"
        assert rebuilt.media.get("GPU", set()) == {last8(h) for h in bm.cached}
        assert rebuilt.media.get("CPU", set()) == {last8(h) for h in host.slot_of}
        assert rebuilt.ranks == {0}
    finally:
        llm.shutdown()
        sub.close(linger=0)


def test_the_disk_tier_is_announced(model, tmp_path):
    """Blocks the disk writer wrote and deleted (a bound of ~10 files against 36 written) are
    DISK events, reported from the writer's thread and sent while no step runs."""
    pub = f"tcp://127.0.0.1:{free_port()}"
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub)
    llm = LLM(model, dtype=torch.float32, num_kv_blocks=20, kv_cache_dir=str(tmp_path / "kv"),
              kv_cache_disk_gb=10 * 9000 / (1 << 30), kv_cache_preload=0.0, kv_events_endpoint=pub)
    try:
        disk = llm.engine.core.core.tiers.disk
        time.sleep(0.5)
        frames = []
        for k in range(3):
            llm.generate([[(5 * k + 3 * i) % 500 + 5 for i in range(200)]], GREEDY)
            frames += receive(sub, 0.2)  # read as it comes (the start's clear may be missed)
        assert disk.drain()
        frames += receive(sub)
        rebuilt = Rebuilt()
        for _, _, payload in frames:
            rebuilt.apply(DECODE.decode(payload))
        removed = {e.medium for _, _, p in frames for e in DECODE.decode(p).events if isinstance(e, BlockRemoved)}
        assert "DISK" in removed and 0 < disk.num_blocks < 36
        assert rebuilt.media.get("DISK", set()) == {last8(h) for h in disk._resident}
        assert rebuilt.media.get("GPU", set()) == {last8(h) for h in llm.engine.core.core.block_manager.cached}
    finally:
        llm.shutdown()
        sub.close(linger=0)


def test_a_closed_engine_frees_its_address(model):
    """A restarted core binds the same endpoint again (the model reloaded, a replica restarted)."""
    pub = f"tcp://127.0.0.1:{free_port()}"
    for _ in range(2):
        llm = LLM(model, dtype=torch.float32, num_kv_blocks=20, kv_events_endpoint=pub, warm_up=False)
        llm.shutdown()
