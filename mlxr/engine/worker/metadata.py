"""The one place the worker builds AttnMetadata: for a step's packed inputs (the input batch,
the runner's prompts computed between steps, the draft model), for a batch of one-token decode
rows (a steady decode step, a decode graph's static inputs) and for one sequence's chunk (a
prefill graph's static inputs)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from mlxr.engine.worker.transfers import to_device
from mlxr.ops.attention.attn_metadata import AttnMetadata


@dataclass
class PackedStep:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttnMetadata
    extra: torch.Tensor  # the caller's own int64 values, packed after the step's


def pack_step(token_ids: list[int], positions: list[int], slots: list[int], query_lens: list[int],
              seq_lens: list[int], tables: list[int], width: int, extra: list[int], block_size: int,
              device: torch.device) -> PackedStep:
    """A step's inputs on device in one copy: its tokens (their positions and cache slots),
    sequence s owning query_lens[s] of them and attending to seq_lens[s] tokens through row s
    of tables (flat, `width` entries a row, padded), and `extra` values after them."""
    t, n = len(token_ids), len(query_lens)
    starts = list(itertools.accumulate(query_lens, initial=0))
    flat = to_device(token_ids + positions + slots + starts + seq_lens + tables + extra, torch.long, device)
    input_ids, pos, slot_t, start_t, lens_t, table_t, extra_t = flat.split([t, t, t, n + 1, n, n * width, len(extra)])
    meta = AttnMetadata(slot_t, table_t.view(n, width), start_t, lens_t, list(query_lens), seq_lens, block_size)
    return PackedStep(input_ids, pos, meta, extra_t)


def decode_metadata(slots: torch.Tensor, tables: torch.Tensor, query_start: torch.Tensor, seq_lens: torch.Tensor,
                    seq_lens_list: list[int], block_size: int) -> AttnMetadata:
    """Rows of one token each (query_start is 0..n); seq_lens_list: their context lengths on
    the host (a graph's capture gives ones: the decode path reads only their count)."""
    n = len(seq_lens_list)
    return AttnMetadata(slots, tables, query_start, seq_lens, [1] * n, seq_lens_list, block_size)


def chunk_metadata(slots: torch.Tensor, table: torch.Tensor, query_start: torch.Tensor, seq_len: torch.Tensor,
                   num_tokens: int, block_size: int) -> AttnMetadata:
    """One sequence's chunk of num_tokens tokens (its block table: table); the host lengths
    size the kernels' grid only, the device ones bound what attention reads."""
    return AttnMetadata(slots, table.view(1, -1), query_start, seq_len, [num_tokens], [num_tokens], block_size)
