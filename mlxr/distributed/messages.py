"""What rank 0 broadcasts to the workers (msgspec, never pickle): the model to load, the KV
cache's size, then one message a step."""
from __future__ import annotations

import msgspec

from mlxr.engine.records import SchedulerOutput


class Load(msgspec.Struct, tag=True):
    """Load this model and keep this rank's share (ModelSpec.as_strings())."""

    model: dict[str, str | None]


class Setup(msgspec.Struct, tag=True):
    """Allocate this rank's share of the paged KV cache: the same block count as rank 0."""

    num_blocks: int
    block_size: int
    host_blocks: int
    kv_dtype: str = "auto"  # rank 0's --kv-cache-dtype: every rank stores its heads alike


class Graphs(msgspec.Struct, tag=True):
    """Capture the CUDA graphs rank 0 captures, in the same order (ModelRunner.enable_cuda_graphs)."""

    scratch_block: int
    max_batch: int
    max_blocks_per_seq: int
    max_prefill_tokens: int


class Step(msgspec.Struct, tag=True):
    """One forward. landed: the tokens rank 0 sampled in the step before, which the workers'
    request states take in first, as rank 0's did."""

    out: SchedulerOutput
    landed_ids: list[str] = []
    landed_tokens: list[list[int]] = []


class Embed(msgspec.Struct, tag=True):
    token_ids: list[int]
    block_table: list[int]
    logit_rows: int = 0  # > 0: the prompt's logits too, chunks of this many (the lm_head gathers across ranks)
    logit_first: int = 0  # from this position on


class Reset(msgspec.Struct, tag=True):
    pass


class Stop(msgspec.Struct, tag=True):
    pass


Message = Load | Setup | Graphs | Step | Embed | Reset | Stop
encode = msgspec.msgpack.Encoder().encode
decode = msgspec.msgpack.Decoder(Message).decode
