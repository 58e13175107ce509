"""CUDA graphs of a prefill chunk of one sequence, at padded token counts.

Run eagerly, a prefill chunk is bound by the host: a few hundred kernel launches from
Python (Triton's launcher alone costs tens of microseconds each) against a few milliseconds
of GPU work. A graph per token bucket takes one launch. Padding tokens compute rows nobody
reads: their K/V go to a scratch block, and attention reads only the real tokens' positions
(its bounds come from query_start_loc and seq_lens, which are inputs of the graph)."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mlxr.engine.kv.cache import KVCache
from mlxr.engine.worker.graph_pool import GraphPool
from mlxr.engine.worker.metadata import chunk_metadata
from mlxr.engine.worker.transfers import copy_into

TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048)


class PrefillGraphs(GraphPool):
    kind = "prefill graph"

    def __init__(self, model: nn.Module, kv_cache: KVCache, scratch_block: int, max_tokens: int,
                 max_blocks_per_seq: int, pool=None, capture_budget_s: float = 30.0) -> None:
        super().__init__([t for t in TOKEN_BUCKETS if t <= max_tokens], pool)
        self.model, self.kv, self.scratch_block = model, kv_cache, scratch_block
        self.width = max_blocks_per_seq
        self.m = max(self.sizes, default=0)
        # One buffer, filled by one host-to-device copy: ids, positions, slots (m each), the
        # block table (width), seq_len, query_start (2), the logits row.
        device = kv_cache.layers[0][0].device
        self.buffer = torch.zeros(3 * self.m + self.width + 4, dtype=torch.long, device=device)
        self.ids, self.positions, self.slots, self.table, self.seq_len, self.q_start, self.row = \
            self.buffer.split([self.m, self.m, self.m, self.width, 1, 2, 1])
        self._capture_all(capture_budget_s)

    def _prepare(self, size: int) -> None:
        table = [self.scratch_block] * -(-size // self.kv.block_size)
        copy_into(self.buffer, self._host_inputs([0] * size, 0, table))

    def _eager_rest(self, size: int) -> str:
        return f"chunks of {size} tokens and fewer"

    def _forward(self, size: int) -> torch.Tensor:
        meta = chunk_metadata(self.slots[:size], self.table, self.q_start, self.seq_len, size, self.kv.block_size)
        hidden = self.model(self.ids[:size], self.positions[:size], self.kv.model_layers, meta)
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
        return self._replay(t)
