"""The runner's persistent view of the requests it runs, and the one place a step's inputs are
built: token ids, positions, slot mapping and block tables (packed with their AttnMetadata by
metadata.py).

The runner learns a request once (NewRequestData) and keeps its tokens and block table; later
steps bring counts and block ids only. A token sampled by the previous step but not yet landed
on the host is read on the device from that step's sampled tokens (PendingTokens)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mlxr.engine.kv.state import RecurrentState
from mlxr.engine.records import NewRequestData, SchedulerOutput
from mlxr.engine.worker.metadata import decode_metadata, pack_step
from mlxr.engine.worker.sampler import SamplingState, make_generator
from mlxr.engine.worker.steady_decode import DecodeArrays, SteadyDecode
from mlxr.engine.worker.transfers import to_device
from mlxr.ops.attention.attn_metadata import AttnMetadata


class CachedRequestState:
    """What the runner keeps of one request between steps."""

    __slots__ = ("request_id", "token_ids", "num_prompt_tokens", "block_table", "sampling", "lora_slot")

    def __init__(self, new: NewRequestData, device: torch.device) -> None:
        self.request_id = new.request_id
        self.token_ids = list(new.token_ids)  # known on the host; landed samples are appended
        self.num_prompt_tokens = new.num_prompt_tokens
        self.block_table = list(new.block_ids)
        self.lora_slot = -1  # its LoRA adapter's slot (model_runner.py); -1: the base model
        params = new.params
        self.sampling = SamplingState(
            params=params,
            prompt_token_ids=self.token_ids[: new.num_prompt_tokens],
            output_token_ids=self.token_ids[new.num_prompt_tokens:],
            eos_token_ids=frozenset(new.eos_token_ids),
            generator=make_generator(params.seed, device),
        )

    def take(self, tokens: list[int]) -> None:
        self.token_ids += tokens
        self.sampling.output_token_ids += tokens


@dataclass
class PendingTokens:
    """The tokens a launched step sampled, still on the device: row rows[request_id] of tokens."""

    tokens: torch.Tensor  # [R] int64
    rows: dict[str, int]


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttnMetadata
    logit_rows: list[int]  # flat row of the last token of each request that samples (all 1 + k of a speculative row)
    sampling_ids: list[str]


def slots_for(table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of positions start..end-1 of the request whose block table is table."""
    return [table[p // block_size] * block_size + p % block_size for p in range(start, end)]


class InputBatch:
    def __init__(self, block_size: int, device: torch.device, recurrent: RecurrentState | None = None) -> None:
        self.block_size = block_size
        self.device = device
        self.states: dict[str, CachedRequestState] = {}
        # A recurrent-state slot per request it knows (models with state layers; kv/state.py).
        self.recurrent = recurrent
        if recurrent is not None:
            recurrent.reset()
        self.steady = SteadyDecode(block_size)  # the last all-decode step's arrays

    def update(self, out: SchedulerOutput) -> None:
        """Apply a step's request changes: forget, learn, extend or replace block tables."""
        states = self.states
        for rid in out.finished_request_ids:
            self.forget(rid)
        for rid in out.preempted_request_ids:
            self.forget(rid)
        for new in out.new_requests:
            states[new.request_id] = CachedRequestState(new, self.device)
            if self.recurrent is not None:
                self.recurrent.acquire(new.request_id)
        for rid, blocks in out.new_block_ids.items():
            states[rid].block_table += blocks
        for rid, table in out.replaced_block_tables.items():
            states[rid].block_table = list(table)

    def forget(self, request_id: str) -> None:
        self.states.pop(request_id, None)
        if self.recurrent is not None:
            self.recurrent.release(request_id)

    def build(self, out: SchedulerOutput, pending: PendingTokens | None, graph_ok: bool,
              graph_fits) -> StepInputs | DecodeArrays:
        """The step's inputs; a steady decode step that a captured graph takes stays as its host
        arrays (graph_fits(n, width) says whether one does)."""
        steady = self.steady.advance(out, self.states, pending.rows) if pending is not None else None
        if steady is None:
            return self._build(out, pending, graph_ok)
        if graph_ok and graph_fits(len(steady.request_ids), steady.tables.shape[1]):
            return steady
        return self._steady_inputs(steady, pending)

    def _build(self, out: SchedulerOutput, pending: PendingTokens | None, split_drafts: bool = False) -> StepInputs:
        """The general path: the arrays built row by row. split_drafts: a speculative row's
        tokens become decode rows of their own (for a decode graph)."""
        bs, states = self.block_size, self.states
        ids, pos, slots, seq_lens, rows, sampling = [], [], [], [], [], []
        fill_at, fill_from = [], []
        tables_rows, q_lens = [], []
        spec = out.spec_token_ids
        for rid, start, n in zip(out.request_ids, out.num_computed_tokens, out.num_scheduled_tokens):
            state = states[rid]
            known, table = state.token_ids, state.block_table
            end = start + n
            chunk = known[start:end]
            drafts = spec.get(rid) if spec else None
            if drafts:  # a speculative row: its last token (known on the host), then the drafts
                assert len(chunk) == 1 and len(known) == start + 1, (rid, start, len(known))
                chunk += drafts
            if len(chunk) < n:  # the last token is still on the device (the previous step's sample)
                fill_at.append(len(ids) + n - 1)
                fill_from.append(pending.rows[rid])
                chunk.append(0)
            ids += chunk
            if n == 1:
                pos.append(start)
                slots.append(table[start // bs] * bs + start % bs)
            else:
                pos += range(start, end)
                slots += slots_for(table, start, end, bs)
            if drafts and split_drafts and self.recurrent is None:
                # Its 1 + k tokens as decode rows over one block table, each attending up to its
                # own position: a layer writes every token's K/V before attention reads them, so
                # this is the causal row, and a step of decode rows replays a decode graph. (Not
                # with state slots: a row's tokens must pass through its one state in order.)
                seq_lens += range(start + 1, end + 1)
                tables_rows += [table] * n
                q_lens += [1] * n
            else:
                seq_lens.append(end)
                tables_rows.append(table)
                q_lens.append(n)
            if drafts:  # logits at each of its 1 + k positions verify the drafts
                rows += range(len(ids) - n, len(ids))
                sampling.append(rid)
            elif end >= len(known):  # every known token computed: the row samples
                rows.append(len(ids) - 1)
                sampling.append(rid)
        width = max(len(t) for t in tables_rows)
        tables = []
        for t in tables_rows:
            tables += t
            if len(t) < width:
                tables += [0] * (width - len(t))
        # Every row one token, every row samples: the next step may advance it (not with state
        # slots, which the steady arrays do not carry).
        if len(ids) == len(q_lens) == len(rows) and not spec and self.recurrent is None:
            self.steady.remember(out, tables, width)
        else:
            self.steady.forget()
        state_slots = [self.recurrent.slot_of[rid] for rid in out.request_ids] if self.recurrent is not None else []
        step = pack_step(ids, pos, slots, q_lens, seq_lens, tables, width, fill_at + fill_from + state_slots, bs,
                         self.device)
        fills = step.extra
        if fill_at:
            step.input_ids[fills[: len(fill_at)]] = pending.tokens[fills[len(fill_at): 2 * len(fill_at)]]
        if state_slots:
            step.meta.state_slots = fills[2 * len(fill_at):]
        return StepInputs(step.input_ids, step.positions, step.meta, rows, sampling)

    def _steady_inputs(self, a: DecodeArrays, pending: PendingTokens) -> StepInputs:
        """StepInputs of a steady decode step from its advanced arrays (see steady_decode.py)."""
        n, width = len(a.request_ids), a.tables.shape[1]
        lens = a.positions + 1
        flat = to_device(torch.from_numpy(np.concatenate(
            [a.positions, a.slots, np.arange(n + 1, dtype=np.int64), lens, a.tables.reshape(-1),
             np.array(a.fill_from, dtype=np.int64)])), torch.long, self.device)
        positions, slot_t, start_t, lens_t, table_t, fill_t = flat.split([n, n, n + 1, n, n * width, n])
        meta = decode_metadata(slot_t, table_t.view(n, width), start_t, lens_t, lens.tolist(), self.block_size)
        return StepInputs(pending.tokens[fill_t], positions, meta, list(range(n)), list(a.request_ids))
