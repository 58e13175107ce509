"""A tensor-parallel worker (ranks 1..N-1): `python -m mlxr.distributed.worker`, placed by
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). It runs what
rank 0 broadcasts: load a model, size the KV cache, then the same forward as rank 0 on its
share, step after step; it samples nothing. It exits when rank 0 says so or is gone."""
from __future__ import annotations

import logging
import math
import os
import sys

import torch

from mlxr.distributed import messages as msg
from mlxr.distributed.model_shard import ModelShard, load_shard
from mlxr.distributed.parallel_state import Rendezvous, TPGroup, cpu_threads, die_with_parent, rank_device
from mlxr.engine.kv.cache import KVCache
from mlxr.engine.worker.model_runner import ModelRunner

log = logging.getLogger("mlxr.distributed.worker")


class Worker:
    def __init__(self, group: TPGroup) -> None:
        self.group = group
        self.shard: ModelShard | None = None
        self.runner: ModelRunner | None = None

    def run(self) -> None:
        while True:
            message = msg.decode(self.group.broadcast_bytes(None))
            if isinstance(message, msg.Stop):
                return
            self.handle(message)

    def handle(self, message: msg.Message) -> None:
        if isinstance(message, msg.Load):
            self.shard, self.runner = None, None
            self.shard = load_shard(message.model, self.group)
        elif isinstance(message, msg.Setup):
            kv = KVCache(self.shard.local_args, message.num_blocks, message.block_size, self.shard.dtype,
                         self.group.device, message.host_blocks, message.kv_dtype)
            self.runner = ModelRunner(self.shard.model, kv, self.group.device)
        elif isinstance(message, msg.Graphs):
            self.runner.enable_cuda_graphs(message.scratch_block, message.max_batch, message.max_blocks_per_seq,
                                           message.max_prefill_tokens, capture_budget_s=math.inf)
        elif isinstance(message, msg.Step):
            self._step(message)
        elif isinstance(message, msg.Embed) and message.logit_rows:
            for _ in self.runner.prompt_logits(message.token_ids, message.block_table, message.logit_rows,
                                               message.logit_first):
                pass  # rank 0 keeps the logits; this rank's share joins each chunk's gather
        elif isinstance(message, msg.Embed):
            self.runner.hidden_states(message.token_ids, message.block_table)
        elif isinstance(message, msg.Reset):
            self.runner.reset()

    def _step(self, message: msg.Step) -> None:
        states = self.runner.batch.states
        for rid, tokens in zip(message.landed_ids, message.landed_tokens):
            state = states.get(rid)
            if state is not None:
                state.take(tokens)
        try:
            self.runner.logits(message.out)
        except Exception:  # noqa: BLE001 - rank 0 fails the same step's requests
            log.exception("rank %d: model step failed", self.group.rank)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if os.environ.get("MLXR_TP_PARENT_PID"):
        die_with_parent(int(os.environ["MLXR_TP_PARENT_PID"]))
    rdzv = Rendezvous.from_env(dict(os.environ))
    device = rank_device(os.environ.get("MLXR_TP_DEVICE", "cpu"), rdzv.local_rank)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads(rdzv.local_world_size))
    group = TPGroup(rdzv, device, float(os.environ.get("MLXR_TP_TIMEOUT_S", "600")))
    try:
        Worker(group).run()
    except RuntimeError as e:  # a collective failed: rank 0 (or a peer) is gone
        log.error("rank %d: the tensor-parallel group broke (%s); this worker exits", rdzv.rank, e)
        os._exit(1)
    group.destroy()


if __name__ == "__main__":
    sys.exit(main())
