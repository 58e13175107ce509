"""Turns a SchedulerOutput into model inputs (flat tokens + AttnMetadata), runs the model,
and returns the logits of the sequences that reached their last uncomputed token."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from mlxr.engine.kv_cache import KVCache
from mlxr.engine.scheduler import ScheduledSeq, SchedulerOutput
from mlxr.engine.sequence import PLACEHOLDER, Sequence
from mlxr.engine.staging import to_device
from mlxr.engine.steady_decode import DecodeArrays, SteadyDecode
from mlxr.layers.attention import AttnMetadata
from mlxr.ops.backend import use_triton


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttnMetadata
    logit_rows: list[int]  # flat row of the last token of each sequence that samples
    sampling_seqs: list[Sequence]


@dataclass
class PendingTokens:
    """The tokens a launched step sampled, still on the device: the next step reads a
    sequence's placeholder from row rows[seq_id] of tokens."""

    tokens: torch.Tensor  # [R] int64
    rows: dict[int, int]


def slots_for(table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of positions start..end-1 of the sequence whose block table is table."""
    return [table[p // block_size] * block_size + p % block_size for p in range(start, end)]


class ModelRunner:
    def __init__(self, model: nn.Module, kv_cache: KVCache, device: torch.device) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = device
        self.steady = SteadyDecode(kv_cache.block_size)  # the last decode step's arrays
        self.graphs = None  # DecodeGraphs, set by the engine on CUDA
        self.prefill_graphs = None  # PrefillGraphs, likewise

    def enable_cuda_graphs(self, scratch_block: int, max_batch: int, max_blocks_per_seq: int,
                           max_prefill_tokens: int = 0) -> None:
        from mlxr.engine.cuda_graphs import DecodeGraphs
        from mlxr.engine.prefill_graphs import PrefillGraphs

        self.graphs = DecodeGraphs(self.model, self.kv_cache, scratch_block, max_batch, max_blocks_per_seq)
        # Prefill graphs bake in the Triton kernels' launch grids; the reference ops read host lengths.
        if max_prefill_tokens and use_triton(self.kv_cache.layers[0][0]):
            self.prefill_graphs = PrefillGraphs(self.model, self.kv_cache, scratch_block, max_prefill_tokens,
                                                max_blocks_per_seq, self.graphs.pool)

    def prepare(self, out: SchedulerOutput, pending: PendingTokens | None = None) -> StepInputs:
        """All of the step's index tensors in one pinned host-to-device copy; a placeholder
        (always a sequence's last token) is filled on the device from pending."""
        return self.plan_step(out, pending, graph_ok=False)

    def _build_inputs(self, out: SchedulerOutput, pending: PendingTokens | None) -> StepInputs:
        """prepare's general path: the arrays built row by row."""
        bs = self.kv_cache.block_size
        ids, pos, slots, q_lens, seq_lens, rows, sampling = [], [], [], [], [], [], []
        fill_at, fill_from = [], []
        for item in out.scheduled:
            seq, start, n = item.seq, item.seq.num_computed_tokens, item.num_tokens
            end = start + n
            if n == 1:  # decode rows: the common case, without the slicing below
                token = seq.token_ids[start]
                if token == PLACEHOLDER:
                    fill_at.append(len(ids))
                    fill_from.append(pending.rows[seq.seq_id])
                    token = 0
                ids.append(token)
                pos.append(start)
                slots.append(seq.block_table[start // bs] * bs + start % bs)
            else:
                chunk = seq.token_ids[start:end]
                if chunk[-1] == PLACEHOLDER:
                    fill_at.append(len(ids) + n - 1)
                    fill_from.append(pending.rows[seq.seq_id])
                    chunk[-1] = 0
                ids += chunk
                pos += range(start, end)
                slots += slots_for(seq.block_table, start, end, bs)
            q_lens.append(n)
            seq_lens.append(end)
            if end == seq.num_tokens:
                rows.append(len(ids) - 1)
                sampling.append(seq)
        width = max(len(s.seq.block_table) for s in out.scheduled)
        tables = []
        for s in out.scheduled:
            tables += s.seq.block_table
            if len(s.seq.block_table) < width:
                tables += [0] * (width - len(s.seq.block_table))
        starts = list(itertools.accumulate(q_lens, initial=0))
        t, n = len(ids), len(q_lens)
        if t == n == len(rows):  # every row one token, every row samples: next may advance it
            self.steady.remember(out, tables, width)
        else:
            self.steady.forget()
        flat = to_device(ids + pos + slots + starts + seq_lens + tables + fill_at + fill_from, torch.long, self.device)
        input_ids, positions, slot_t, start_t, lens_t, table_t, fills = flat.split(
            [t, t, t, n + 1, n, n * width, 2 * len(fill_at)])
        if fill_at:
            input_ids[fills[: len(fill_at)]] = pending.tokens[fills[len(fill_at):]]
        meta = AttnMetadata(
            slot_mapping=slot_t,
            block_tables=table_t.view(n, width),
            query_start_loc=start_t,
            seq_lens=lens_t,
            query_lens_list=q_lens,
            seq_lens_list=seq_lens,
            block_size=bs,
        )
        return StepInputs(input_ids, positions, meta, rows, sampling)

    def _steady_inputs(self, a: DecodeArrays, out: SchedulerOutput, pending: PendingTokens) -> StepInputs:
        """StepInputs of a steady decode step from its advanced arrays (see steady_decode.py)."""
        n, width = len(a.seq_ids), a.tables.shape[1]
        lens = a.positions + 1
        flat = to_device(torch.from_numpy(np.concatenate(
            [a.positions, a.slots, np.arange(n + 1, dtype=np.int64), lens, a.tables.reshape(-1),
             np.array(a.fill_from, dtype=np.int64)])), torch.long, self.device)
        positions, slot_t, start_t, lens_t, table_t, fill_t = flat.split([n, n, n + 1, n, n * width, n])
        meta = AttnMetadata(
            slot_mapping=slot_t,
            block_tables=table_t.view(n, width),
            query_start_loc=start_t,
            seq_lens=lens_t,
            query_lens_list=[1] * n,
            seq_lens_list=lens.tolist(),
            block_size=self.kv_cache.block_size,
        )
        return StepInputs(pending.tokens[fill_t], positions, meta, list(range(n)), [item.seq for item in out.scheduled])

    @torch.inference_mode()
    def execute(
        self, out: SchedulerOutput, pending: PendingTokens | None = None
    ) -> tuple[list[Sequence], torch.Tensor | None]:
        """Queue one step; returns the sequences to sample and their float32 logits [S, vocab].
        After a CUDA graph replay the logits may be a view of the graph's static output: valid
        until the next step, so callers that keep them must copy."""
        self.kv_cache.swap_out(out.blocks_to_swap_out)
        self.kv_cache.swap_in(out.blocks_to_swap_in)
        self.kv_cache.copy_blocks(out.blocks_to_copy)
        if self._prefill_graph_fits(out):
            seq, n = out.scheduled[0].seq, out.scheduled[0].num_tokens
            start = seq.num_computed_tokens
            logits = self.prefill_graphs.run(seq.token_ids[start : start + n], start, seq.block_table)
            return ([seq], logits.float()) if start + n == seq.num_tokens else ([], None)
        inputs = self.plan_step(out, pending)
        if isinstance(inputs, DecodeArrays):
            return [item.seq for item in out.scheduled], self.graphs.run_steady(inputs, pending.tokens)
        every_row_samples = len(inputs.sampling_seqs) == inputs.meta.num_seqs
        if self.graphs is not None and every_row_samples and self.graphs.can_run(inputs.meta):
            # Every decode row samples, in order, so the graph's logits are the answer.
            return inputs.sampling_seqs, self.graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers, inputs.meta)
        if not inputs.sampling_seqs:
            return [], None
        rows = to_device(inputs.logit_rows, torch.long, hidden.device)
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        return inputs.sampling_seqs, logits.float()

    def plan_step(self, out: SchedulerOutput, pending: PendingTokens | None,
                  graph_ok: bool = True) -> StepInputs | DecodeArrays:
        """The step's inputs; with graph_ok, a steady decode step that a captured graph can take
        stays as its host arrays (the graph's inputs are filled from them in one copy)."""
        steady = self.steady.advance(out, pending.rows) if pending is not None else None
        if steady is None:
            return self._build_inputs(out, pending)
        if graph_ok and self.graphs is not None and self.graphs.fits(len(steady.seq_ids), steady.tables.shape[1]):
            return steady
        return self._steady_inputs(steady, out, pending)

    def _prefill_graph_fits(self, out: SchedulerOutput) -> bool:
        """One sequence's prompt chunk (no placeholder in it) that a captured bucket holds."""
        if self.prefill_graphs is None or len(out.scheduled) != 1:
            return False
        item = out.scheduled[0]
        seq, n = item.seq, item.num_tokens
        return (n > 1 and seq.token_ids[seq.num_computed_tokens + n - 1] != PLACEHOLDER
                and self.prefill_graphs.bucket(n, len(seq.block_table)) is not None)

    @torch.inference_mode()
    def hidden_states(self, seq: Sequence) -> torch.Tensor:
        """Final hidden states [T, hidden] of all of seq's tokens in one prefill
        (seq already holds the blocks); used for embeddings."""
        out = SchedulerOutput([ScheduledSeq(seq, seq.num_tokens)])
        inputs = self.prepare(out)
        return self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers, inputs.meta)
