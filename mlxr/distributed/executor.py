"""Rank 0's side of tensor parallelism, inside the engine core process: it starts this node's
workers, joins the group, and broadcasts every step's SchedulerOutput before running its own
share of the forward (TPRunner). Only rank 0 samples; the workers learn the sampled tokens
from the next step's message. A worker that dies breaks the group: the step in flight fails
its requests, and the core process exits with the reason (the frontend fails the rest)."""
from __future__ import annotations

import atexit
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Iterator

import msgspec
import torch
import torch.distributed as dist

from mlxr.config import ParallelConfig
from mlxr.distributed import messages as msg
from mlxr.distributed.launch import spawn_workers, stop
from mlxr.distributed.model_shard import load_shard
from mlxr.distributed.parallel_state import (
    Rendezvous, TPGroup, WorkerGroupError, cpu_threads, free_port, rank_device,
)
from mlxr.engine.core.core_parts import CoreParts
from mlxr.engine.kv.cache import KVCache
from mlxr.engine.worker import prompt_logprobs as plp
from mlxr.engine.worker.model_runner import ModelRunner

log = logging.getLogger(__name__)

# After a worker dies, the step loop gets this long to fail its step and exit on its own (a
# gloo collective errors at once; an NCCL one may wait for its timeout) before the process ends.
EXIT_GRACE_S = 5.0


class TPExecutor:
    def __init__(self, parallel: ParallelConfig, device_type: str) -> None:
        port = parallel.master_port or free_port(parallel.master_addr)
        self.cuda_graphs = parallel.cuda_graphs
        self.procs = spawn_workers(parallel, device_type, port)
        self.fatal: str | None = None
        self._stopping = False
        atexit.register(self.shutdown)
        threading.Thread(target=self._watch, name="tp-worker-watch", daemon=True).start()
        if device_type == "cpu":  # the node's cores shared between its ranks
            torch.set_num_threads(cpu_threads(parallel.nproc_per_node))
        rdzv = Rendezvous(0, parallel.tensor_parallel_size, 0, parallel.nproc_per_node, parallel.master_addr, port)
        self.group = TPGroup(rdzv, rank_device(device_type, 0), parallel.timeout_s)

    def send(self, message: msg.Message) -> None:
        if self.fatal is not None:
            raise WorkerGroupError(self.fatal)
        try:
            self.group.broadcast_bytes(msg.encode(message))
        except RuntimeError as e:
            self.check_failure(e)
            self._broken(f"the tensor-parallel group broke: {e}")

    def check_failure(self, error: RuntimeError) -> None:
        """After a step raised: a broken group (a worker gone, a collective cut off) becomes
        the engine's fatal error; anything else stays the step's own failure."""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and not any(p.poll() is not None for p in self.procs):
            if isinstance(error, dist.DistError) or "Connection" in str(error):
                break
            time.sleep(0.1)
        dead = [p for p in self.procs if p.poll() is not None]
        if dead:
            self._broken(f"tensor-parallel worker pid {dead[0].pid} exited with status {dead[0].returncode}")
        if isinstance(error, dist.DistError) or "Connection" in str(error):
            self._broken(f"the tensor-parallel group broke: {error}")

    def _broken(self, reason: str) -> None:
        if self.fatal is None:
            self.fatal = reason
            log.error("%s; the engine core stops", reason)
        raise WorkerGroupError(self.fatal)

    def _watch(self) -> None:
        while not self._stopping:
            for rank, p in enumerate(self.procs, start=1):
                if p.poll() is not None and not self._stopping:
                    reason = f"tensor-parallel worker pid {p.pid} exited with status {p.returncode}"
                    self.fatal = self.fatal or reason
                    log.error("%s; failing the requests in flight and stopping the engine core", reason)
                    time.sleep(EXIT_GRACE_S)
                    if not self._stopping:
                        log.error("the engine core exits: %s", self.fatal)
                        self._kill_workers()
                        os._exit(1)
                    return
            time.sleep(0.2)

    def _kill_workers(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        stop(self.procs, 0.0)

    def shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        group = getattr(self, "group", None)  # None: the rendezvous itself failed
        if self.fatal is None and group is not None:
            try:
                group.broadcast_bytes(msg.encode(msg.Stop()))
            except RuntimeError:
                pass
            stop(self.procs)
            group.destroy()
        else:
            self._kill_workers()


class TPRunner(ModelRunner):
    """The model runner of rank 0: each forward is announced to the workers first."""

    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, device: torch.device, executor: TPExecutor) -> None:
        super().__init__(model, kv_cache, device)
        self.executor = executor
        self.can_capture_graphs = executor.cuda_graphs
        host = kv_cache.host_layers[0][0].shape[0] if kv_cache.host_layers else 0
        executor.send(msg.Setup(kv_cache.num_blocks, kv_cache.block_size, host, kv_cache.kv_dtype))

    @property
    def fatal(self) -> str | None:
        return self.executor.fatal

    def enable_cuda_graphs(self, scratch_block: int, max_batch: int, max_blocks_per_seq: int,
                           max_prefill_tokens: int = 0, capture_budget_s: float | None = None) -> None:
        self.executor.send(msg.Graphs(scratch_block, max_batch, max_blocks_per_seq, max_prefill_tokens))
        super().enable_cuda_graphs(scratch_block, max_batch, max_blocks_per_seq, max_prefill_tokens, math.inf)

    def shutdown(self) -> None:
        self.executor.shutdown()

    def reset(self) -> None:
        self.executor.send(msg.Reset())
        super().reset()

    def _forward_step(self, out):
        last = self._last
        ids, tokens = [], []
        if last is not None:
            assert not last.in_flight, "tensor parallelism runs without step overlap"
            landed = last.result()
            ids, tokens = landed.request_ids, landed.sampled_token_ids
        self._last = None  # its tokens are on their way: never sent twice
        self.executor.send(msg.Step(out, list(ids), [list(t) for t in tokens]))
        try:
            return super()._forward_step(out)
        except RuntimeError as e:
            self.executor.check_failure(e)
            raise

    def housekeeping(self, out) -> None:
        self.executor.send(msg.Step(out, [], []))  # a worker applies it and forwards nothing
        super().housekeeping(out)

    def hidden_states(self, token_ids: list[int], block_table: list[int]) -> torch.Tensor:
        self.executor.send(msg.Embed(list(token_ids), list(block_table)))
        try:
            return super().hidden_states(token_ids, block_table)
        except RuntimeError as e:
            self.executor.check_failure(e)
            raise

    def prompt_logits(self, token_ids: list[int], block_table: list[int],
                      rows: int | None = None, first: int = 0) -> Iterator[torch.Tensor]:
        rows = rows or plp.LOGIT_ROWS
        self.executor.send(msg.Embed(list(token_ids), list(block_table), logit_rows=rows, logit_first=first))
        chunks = super().prompt_logits(token_ids, block_table, rows, first)
        try:
            yield from chunks
        except GeneratorExit:  # the caller stopped early: the workers still gather every chunk
            for _ in chunks:
                pass
            raise
        except RuntimeError as e:
            self.executor.check_failure(e)
            raise


def tp_core_parts(ref: str, dtype: str | None, weight_dtype: str | None, device: str | None,
                  quantization: str | None, parallel: str) -> CoreParts:
    """The engine core process's factory under tensor parallelism (engine_factory.build_engine)."""
    config = msgspec.json.decode(parallel, type=ParallelConfig)
    device_type = torch.device(device).type if device else "cpu"
    executor = TPExecutor(config, device_type)
    spec = {"ref": ref, "dtype": dtype, "weight_dtype": weight_dtype, "device": device, "quantization": quantization}
    executor.send(msg.Load(spec))
    shard = load_shard(spec, executor.group)
    return CoreParts(shard.model, shard.local_args, shard.dtype, executor.group.device,
                     make_runner=functools.partial(TPRunner, executor=executor))
