"""CUDA graphs of the decode step at a set of padded batch sizes, captured at start-up.

A decode step launches hundreds of small kernels; replaying a captured graph removes the
Python and launch overhead. Padding rows write into a scratch block that no sequence owns."""
from __future__ import annotations

import logging
import time

import torch
from torch import nn

from mlxr.engine.kv_cache import KVCache
from mlxr.layers.attention import AttnMetadata

log = logging.getLogger(__name__)

BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


class DecodeGraphs:
    def __init__(
        self,
        model: nn.Module,
        kv_cache: KVCache,
        scratch_block: int,
        max_batch: int,
        max_blocks_per_seq: int,
        capture_budget_s: float = 60.0,
    ) -> None:
        self.model, self.kv = model, kv_cache
        self.scratch_block = scratch_block
        self.width = max_blocks_per_seq
        self.sizes = [b for b in BATCH_SIZES if b <= max_batch]
        device = kv_cache.layers[0][0].device
        m = max(self.sizes)
        long = dict(dtype=torch.long, device=device)
        self.input_ids = torch.zeros(m, **long)
        self.positions = torch.zeros(m, **long)
        self.slots = torch.zeros(m, **long)
        self.tables = torch.zeros(m, self.width, **long)
        self.seq_lens = torch.ones(m, **long)
        self.query_start = torch.arange(m + 1, **long)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self._capture_all(capture_budget_s)

    def _meta(self, b: int) -> AttnMetadata:
        return AttnMetadata(
            slot_mapping=self.slots[:b],
            block_tables=self.tables[:b],
            query_start_loc=self.query_start[: b + 1],
            seq_lens=self.seq_lens[:b],
            query_lens_list=[1] * b,
            seq_lens_list=[1] * b,  # only the count is read on the decode path
            block_size=self.kv.block_size,
        )

    def _reset_padding(self, start: int) -> None:
        self.input_ids[start:] = 0
        self.positions[start:] = 0
        self.slots[start:] = self.scratch_block * self.kv.block_size
        self.tables[start:] = self.scratch_block
        self.seq_lens[start:] = 1

    @torch.inference_mode()
    def _capture_all(self, budget_s: float) -> None:
        t0 = time.perf_counter()
        self._reset_padding(0)
        for b in sorted(self.sizes, reverse=True):  # largest first, so smaller ones reuse its pool
            if time.perf_counter() - t0 > budget_s:
                log.warning("CUDA graph capture stopped at the %.0fs budget; batch %d and below run eagerly", budget_s, b)
                break
            self.graphs[b] = self._capture(b)
        log.info("captured %d decode graphs in %.1fs", len(self.graphs), time.perf_counter() - t0)

    def _capture(self, b: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        meta = self._meta(b)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph (allocator, autotuning)
            for _ in range(2):
                self._forward(b, meta)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(b, meta)
        self.pool = graph.pool()
        return graph, logits

    def _forward(self, b: int, meta: AttnMetadata) -> torch.Tensor:
        hidden = self.model(self.input_ids[:b], self.positions[:b], self.kv.layers, meta)
        return self.model.compute_logits(hidden)

    def padded_size(self, n: int) -> int | None:
        return next((b for b in sorted(self.graphs) if b >= n), None)

    def can_run(self, meta: AttnMetadata) -> bool:
        return (
            meta.is_decode_only
            and self.padded_size(meta.num_seqs) is not None
            and meta.block_tables.shape[1] <= self.width
        )

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        """Logits [n, vocab] of a decode batch of n sequences, by graph replay."""
        n = meta.num_seqs
        b = self.padded_size(n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slots[:n].copy_(meta.slot_mapping)
        self.tables[:n, : meta.block_tables.shape[1]].copy_(meta.block_tables)
        self.tables[:n, meta.block_tables.shape[1]:] = self.scratch_block
        self.seq_lens[:n].copy_(meta.seq_lens)
        self._reset_padding(n)
        graph, logits = self.graphs[b]
        graph.replay()
        return logits[:n]
