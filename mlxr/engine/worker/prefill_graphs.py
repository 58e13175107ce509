"""CUDA graphs of a prefill chunk of one sequence, at padded token counts.

Run eagerly, a prefill chunk is bound by the host: a few hundred kernel launches from
Python (Triton's launcher alone costs tens of microseconds each) against a few milliseconds
of GPU work. A graph per token bucket takes one launch. Padding tokens compute rows nobody
reads: their K/V go to a scratch block, and attention reads only the real tokens' positions
(its bounds come from query_start_loc and seq_lens, which are inputs of the graph)."""
from __future__ import annotations

import logging
import time

import numpy as np
import torch
from torch import nn

from mlxr.engine.kv.cache import KVCache
from mlxr.engine.worker.transfers import copy_into
from mlxr.ops.attention.attn_metadata import AttnMetadata

log = logging.getLogger(__name__)

TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048)


class PrefillGraphs:
    def __init__(self, model: nn.Module, kv_cache: KVCache, scratch_block: int, max_tokens: int,
                 max_blocks_per_seq: int, pool=None, capture_budget_s: float = 30.0) -> None:
        self.model, self.kv, self.scratch_block = model, kv_cache, scratch_block
        self.width = max_blocks_per_seq
        self.sizes = [t for t in TOKEN_BUCKETS if t <= max_tokens]
        self.m = max(self.sizes, default=0)
        # One buffer, filled by one host-to-device copy: ids, positions, slots (m each), the
        # block table (width), seq_len, query_start (2), the logits row.
        device = kv_cache.layers[0][0].device
        self.buffer = torch.zeros(3 * self.m + self.width + 4, dtype=torch.long, device=device)
        self.ids, self.positions, self.slots, self.table, self.seq_len, self.q_start, self.row = \
            self.buffer.split([self.m, self.m, self.m, self.width, 1, 2, 1])
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = pool
        self._capture_all(capture_budget_s)

    @torch.inference_mode()
    def _capture_all(self, budget_s: float) -> None:
        t0 = time.perf_counter()
        for t in sorted(self.sizes, reverse=True):
            if time.perf_counter() - t0 > budget_s:
                log.warning("prefill graph capture stopped at the %.0fs budget; chunks of %d tokens and fewer run eagerly",
                            budget_s, t)
                break
            table = [self.scratch_block] * -(-t // self.kv.block_size)
            copy_into(self.buffer, self._host_inputs([0] * t, 0, table))
            self.graphs[t] = self._capture(t)
        log.info("captured %d prefill graphs in %.1fs", len(self.graphs), time.perf_counter() - t0)

    def _capture(self, t: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph (allocator, autotuning)
            for _ in range(2):
                self._forward(t)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(t)
        self.pool = graph.pool()
        return graph, logits

    def _forward(self, t: int) -> torch.Tensor:
        meta = AttnMetadata(
            slot_mapping=self.slots[:t], block_tables=self.table.view(1, -1), query_start_loc=self.q_start,
            seq_lens=self.seq_len, query_lens_list=[t], seq_lens_list=[t],  # sizes the grid only
            block_size=self.kv.block_size,
        )
        hidden = self.model(self.ids[:t], self.positions[:t], self.kv.layers, meta)
        return self.model.compute_logits(hidden.index_select(0, self.row))

    def bucket(self, num_tokens: int, num_blocks: int) -> int | None:
        """The smallest bucket that holds the chunk, if it was captured (a larger one would
        waste its padding)."""
        if num_blocks > self.width:
            return None
        t = next((t for t in self.sizes if t >= num_tokens), None)
        return t if t in self.graphs else None

    def _host_inputs(self, token_ids: list[int], start: int, table: list[int]) -> torch.Tensor:
        """The buffer's contents: padding tokens at position 0 write to the scratch block, the
        table's unused entries name it too. Built with numpy: the buffer holds thousands of
        entries, and a Python list of them cost ~0.4 ms of the step to convert. A tensor over
        the array: copy_into stages it without copying it once more."""
        n, m, bs = len(token_ids), self.m, self.kv.block_size
        host = np.zeros(self.buffer.numel(), dtype=np.int64)
        ids, positions, slots, tab, tail = np.split(host, [m, 2 * m, 3 * m, 3 * m + self.width])
        ids[:n] = token_ids
        positions[:n] = np.arange(start, start + n)
        blocks = np.asarray(table, dtype=np.int64)
        slots[:n] = blocks[positions[:n] // bs] * bs + positions[:n] % bs
        slots[n:] = self.scratch_block * bs
        tab[: len(table)] = blocks
        tab[len(table):] = self.scratch_block
        tail[:] = (start + n, 0, n, n - 1)
        return torch.from_numpy(host)

    @torch.inference_mode()
    def run(self, token_ids: list[int], start: int, table: list[int]) -> torch.Tensor:
        """Logits [1, vocab] of the last of token_ids (positions start.., one sequence whose
        block table is table), by replaying the smallest bucket that holds them."""
        t = self.bucket(len(token_ids), len(table))
        copy_into(self.buffer, self._host_inputs(token_ids, start, table))
        graph, logits = self.graphs[t]
        graph.replay()
        return logits
