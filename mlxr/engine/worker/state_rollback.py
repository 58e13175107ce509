"""Speculative decoding over recurrent-state layers: a verify step runs a row's last token and
all its drafts through the layers, so their states move past every draft. A row that rejects
some gets the state it had before the step back, then its last token and the accepted drafts
are computed again, which leaves the state after the last accepted token (the attention
layers rewrite the same K/V at the same slots on the way)."""
from __future__ import annotations

import torch

from mlxr.engine.kv.cache import KVCache
from mlxr.engine.records import ModelRunnerOutput, SchedulerOutput
from mlxr.engine.worker.input_batch import InputBatch, slots_for
from mlxr.engine.worker.metadata import pack_step


class StateSnapshot:
    """The drafted rows' states before a verify step."""

    def __init__(self, kv: KVCache, out: SchedulerOutput) -> None:
        state = kv.state
        self.request_ids = [rid for rid in out.request_ids if out.spec_token_ids.get(rid)]
        slots = [state.slot_of[rid] for rid in self.request_ids]
        self.slots = torch.tensor(slots, device=next(iter(state.pools.values()))[0].device)
        self.saved = {layer: (conv.index_select(0, self.slots), delta.index_select(0, self.slots))
                      for layer, (conv, delta) in state.pools.items()}
        self.starts = dict(zip(out.request_ids, out.num_computed_tokens))
        self.num_drafts = {rid: len(out.spec_token_ids[rid]) for rid in self.request_ids}

    def roll_back(self, model: torch.nn.Module, kv: KVCache, batch: InputBatch, output: ModelRunnerOutput) -> None:
        sampled = dict(zip(output.request_ids, output.sampled_token_ids))
        rows = [i for i, rid in enumerate(self.request_ids) if len(sampled.get(rid, ())) <= self.num_drafts[rid]]
        if not rows:
            return
        index = self.slots[rows]
        for layer, (conv, delta) in kv.state.pools.items():
            saved_conv, saved_delta = self.saved[layer]
            conv.index_copy_(0, index, saved_conv[rows])
            delta.index_copy_(0, index, saved_delta[rows])
        self._recompute([self.request_ids[i] for i in rows], sampled, model, kv, batch)

    def _recompute(self, request_ids, sampled, model, kv: KVCache, batch: InputBatch) -> None:
        """Each row's last token and accepted drafts (all but its last sampled token) again."""
        bs = kv.block_size
        ids, pos, cache_slots, q_lens, seq_lens, tables = [], [], [], [], [], []
        for rid in request_ids:
            state, start = batch.states[rid], self.starts[rid]
            n = len(sampled[rid])  # the last token and n - 1 accepted drafts
            ids += state.token_ids[start: start + n]
            pos += range(start, start + n)
            cache_slots += slots_for(state.block_table, start, start + n, bs)
            q_lens.append(n)
            seq_lens.append(start + n)
            tables.append(state.block_table)
        width = max(len(t) for t in tables)
        flat = [b for t in tables for b in t + [0] * (width - len(t))]
        step = pack_step(ids, pos, cache_slots, q_lens, seq_lens, flat, width,
                         [kv.state.slot_of[rid] for rid in request_ids], bs, batch.device)
        step.meta.state_slots = step.extra
        model(step.input_ids, step.positions, kv.model_layers, step.meta)
