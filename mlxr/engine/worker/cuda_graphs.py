"""CUDA graphs of the decode step at a set of padded batch sizes, captured at start-up.

A decode step launches hundreds of small kernels; replaying a captured graph removes the
Python and launch overhead. Padding rows write into a scratch block that no sequence owns."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mlxr.engine.kv.cache import KVCache
from mlxr.engine.worker.graph_pool import GraphPool
from mlxr.engine.worker.metadata import decode_metadata
from mlxr.engine.worker.steady_decode import DecodeArrays
from mlxr.ops.attention.attn_metadata import AttnMetadata

# 3, 5, 6 and 9: a speculative row of 1 + k tokens is 1 + k decode rows, and at batch 1 padding
# it to the next size costs replay time (SmolLM2 Q4_1 on an H100: 4 rows 2.07 ms, 8 rows 2.27,
# 12 rows 2.43).
BATCH_SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


def graph_sizes(max_batch: int) -> list[int]:
    """The padded sizes captured for up to max_batch rows: BATCH_SIZES below it, and max_batch
    itself (so a step of max_batch rows, e.g. 40 drafting rows, replays rather than running
    eagerly, and nothing past the bound is captured)."""
    return [b for b in BATCH_SIZES if b < max_batch] + [max_batch]


class GraphInputs:
    """One graph's static inputs: positions, slots, context lengths and token sources in one
    int64 buffer, the block tables beside it (a step fills both with one copy each, the
    tables only as wide as its sequences need), and the token ids (gathered on the device
    from the last step's samples)."""

    def __init__(self, b: int, width: int, device: torch.device) -> None:
        self.b, self.width = b, width
        self.buf = torch.zeros(4 * b, dtype=torch.long, device=device)
        self.positions, self.slots, self.seq_lens, self.fill = self.buf.split([b, b, b, b])
        self.tables = torch.zeros(b, width, dtype=torch.long, device=device)
        self.input_ids = torch.zeros(b, dtype=torch.long, device=device)
        self.query_start = torch.arange(b + 1, dtype=torch.long, device=device)
        self.state_slots = torch.zeros(b, dtype=torch.long, device=device)  # recurrent-state layers' rows

    def meta(self, block_size: int, stateful: bool = False) -> AttnMetadata:
        meta = decode_metadata(self.slots, self.tables, self.query_start, self.seq_lens, [1] * self.b, block_size)
        if stateful:
            meta.state_slots = self.state_slots
        return meta

    def host_arrays(self, n: int, width: int, scratch_block: int,
                    block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Host buffers in buf's layout (and as its four rows) and of the tables' first `width`
        columns, rows n.. already padding. (A kernel reads no table entry past a row's
        context, so the columns past `width` may hold an earlier step's.)"""
        small = np.empty(4 * self.b, dtype=np.int64)
        tables = np.empty((self.b, width), dtype=np.int64)
        pos, slots, lens, fill = small.reshape(4, self.b)
        pos[n:], slots[n:], lens[n:], tables[n:] = padding_row(scratch_block, block_size)
        fill[n:] = 0
        return small, small.reshape(4, self.b), tables


def padding_row(scratch_block: int, block_size: int) -> tuple[int, int, int, int]:
    """(position, slot, context length, block table entry) of a graph's padding row: it attends
    to one token of the scratch block and writes its K/V there."""
    return 0, scratch_block * block_size, 1, scratch_block


def _staged(host: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array as a tensor that a copy to `device` can read asynchronously (pinned for a GPU)."""
    t = torch.from_numpy(host)
    return t if device.type == "cpu" else t.pin_memory()


class DecodeGraphs(GraphPool):
    def __init__(
        self,
        model: nn.Module,
        kv_cache: KVCache,
        scratch_block: int,
        max_batch: int,
        max_blocks_per_seq: int,
        capture_budget_s: float = 60.0,
        lora_step=None,
    ) -> None:
        """lora_step: the model's LoRAStep where it serves adapters: the graphs then hold the
        adapters' low-rank products, each row reading its slot from a static buffer (-1: the base)."""
        super().__init__(self.graph_sizes(max_batch))
        self.model, self.kv = model, kv_cache
        self.scratch_block = scratch_block
        self.width = max_blocks_per_seq
        self.device = kv_cache.layers[0][0].device
        self.inputs = {b: GraphInputs(b, self.width, self.device) for b in self.sizes}
        self.lora_step = lora_step
        self.lora_slots = None if lora_step is None else torch.full((max(self.sizes),), -1, dtype=torch.long,
                                                                    device=self.device)
        self._capture_all(capture_budget_s)

    graph_sizes = staticmethod(graph_sizes)
    kind = "decode CUDA graph"

    def _fill_padding(self, g: GraphInputs, start: int) -> None:
        position, slot, length, block = padding_row(self.scratch_block, self.kv.block_size)
        g.input_ids[start:] = 0
        g.positions[start:] = position
        g.slots[start:] = slot
        g.tables[start:] = block
        g.seq_lens[start:] = length
        if self.kv.state is not None:  # padding rows start from zeros and write only the scratch slot
            g.state_slots[start:] = self.kv.state.scratch

    def _prepare(self, size: int) -> None:
        self._fill_padding(self.inputs[size], 0)

    def _eager_rest(self, size: int) -> str:
        return f"batch {size} and below"

    def _forward(self, size: int) -> torch.Tensor:
        g = self.inputs[size]
        if self.lora_step is not None:  # captured with the adapters' products, slots from the buffer
            self.lora_step.token_slots = self.lora_slots[:size]
        try:
            hidden = self.model(g.input_ids, g.positions, self.kv.model_layers,
                                g.meta(self.kv.block_size, self.kv.state is not None))
        finally:
            if self.lora_step is not None:
                self.lora_step.clear()
        return self.model.compute_logits(hidden).float()  # the sampler's dtype, cast in the graph

    def _set_lora_rows(self, n: int) -> None:
        """The step's rows' adapter slots into the graphs' buffer (on the device, in stream order):
        the runner's LoRAStep holds them while a step has adapter rows; none: every row the base."""
        if self.lora_slots is None:
            return
        rows = self.lora_step.token_slots
        if rows is None:
            self.lora_slots.fill_(-1)
            return
        self.lora_slots[:n].copy_(rows[:n])
        self.lora_slots[n:].fill_(-1)

    def padded_size(self, n: int) -> int | None:
        return next((b for b in sorted(self.graphs) if b >= n), None)

    def can_run(self, meta: AttnMetadata) -> bool:
        return meta.is_decode_only and self.fits(meta.num_seqs, meta.block_tables.shape[1])

    def fits(self, n: int, width: int) -> bool:
        """Whether a graph takes n decode rows with block tables `width` wide."""
        return width <= self.width and self.padded_size(n) is not None

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        """float32 logits [n, vocab] of a decode batch of n sequences, by graph replay."""
        n = meta.num_seqs
        b = self.padded_size(n)
        g = self.inputs[b]
        g.input_ids[:n].copy_(input_ids)
        g.positions[:n].copy_(positions)
        g.slots[:n].copy_(meta.slot_mapping)
        g.tables[:n, : meta.block_tables.shape[1]].copy_(meta.block_tables)
        g.tables[:n, meta.block_tables.shape[1]:] = self.scratch_block
        g.seq_lens[:n].copy_(meta.seq_lens)
        if meta.state_slots is not None:
            g.state_slots[:n].copy_(meta.state_slots)
        self._fill_padding(g, n)
        self._set_lora_rows(n)
        return self._replay(b)[:n]

    @torch.inference_mode()
    def run_steady(self, a: DecodeArrays, tokens: torch.Tensor) -> torch.Tensor:
        """As run, for a steady decode step (steady_decode.py) from its host arrays: two copies
        fill the graph's inputs and one gather its token ids, where run takes a dozen small
        copies (at batch 1 each costs about as much GPU time as a layer's smallest kernel)."""
        n, width = len(a.request_ids), a.tables.shape[1]
        g = self.inputs[self.padded_size(n)]
        small, (pos, slots, lens, fill), tables = g.host_arrays(n, width, self.scratch_block, self.kv.block_size)
        pos[:n], slots[:n], lens[:n], fill[:n] = a.positions, a.slots, a.positions + 1, a.fill_from
        tables[:n] = a.tables
        g.buf.copy_(_staged(small, self.device), non_blocking=True)
        g.tables[:, :width].copy_(_staged(tables, self.device), non_blocking=True)
        torch.index_select(tokens, 0, g.fill, out=g.input_ids)
        self._set_lora_rows(n)
        return self._replay(g.b)[:n]
