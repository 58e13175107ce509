"""KV events of an adapter's request carry its lora_id (vLLM's BlockStored field), read by a real
ZMQ SUB socket with vLLM's schema; the same prompt under the base and under the adapter stores
different blocks."""
from __future__ import annotations

import socket
import time
from typing import Any

import msgspec
import torch
import zmq

from lora_fixtures import peft_adapter
from model_fixtures import fixture_model

from mlxr import LLM, SamplingParams


class BlockStored(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):  # vLLM's schema
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_adapter_blocks_carry_the_lora_id_and_differ_from_the_base():
    base = fixture_model("tiny-llama").hf_dir
    endpoint = f"tcp://127.0.0.1:{_port()}"
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    llm = LLM(str(base), dtype=torch.float32, enable_lora=True, kv_events_endpoint=endpoint, warm_up=False)
    try:
        llm.load_lora("a", str(peft_adapter(base, "r4-qv")))
        time.sleep(0.5)  # the subscription reaches the publisher
        prompt = list(range(5, 5 + 40))
        params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
        llm.generate([prompt], params)
        llm.generate([prompt], params, lora="a")
        stored: list[BlockStored] = []
        while sub.poll(1000):
            _, _, payload = sub.recv_multipart()
            raw = msgspec.msgpack.decode(payload)
            stored += [msgspec.convert(e, BlockStored) for e in raw[1] if e[0] == "BlockStored"]
        by_lora: dict[int | None, set[int]] = {}
        for e in stored:
            by_lora.setdefault(e.lora_id, set()).update(e.block_hashes)
        lora_id = llm.engine.core.core.adapters.get("a").lora_id
        assert set(by_lora) == {None, lora_id}
        assert len(by_lora[None]) == len(by_lora[lora_id]) == 2  # two full blocks of 16 each
        assert not by_lora[None] & by_lora[lora_id]
    finally:
        llm.shutdown()
        sub.close(linger=0)
