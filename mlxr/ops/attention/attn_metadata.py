"""The metadata every attention op and layer reads: where this step's K/V go and what each
sequence attends to. Built by the engine worker (engine/worker/metadata.py), passed down as an argument."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttnMetadata:
    """Where each new token's K/V goes and what each sequence attends to.

    Tokens of all sequences are flattened: sequence s owns rows
    query_start_loc[s]:query_start_loc[s+1] of the batch.
    """

    slot_mapping: torch.Tensor  # [T] int64: cache slot (block * block_size + offset) per token
    block_tables: torch.Tensor  # [S, max_blocks] int64, padded with 0
    query_start_loc: torch.Tensor  # [S + 1] int64 (cu_seqlens of the new tokens)
    seq_lens: torch.Tensor  # [S] int64: context length after this step (cached + new)
    query_lens_list: list[int]  # host copies, so reference ops never sync
    seq_lens_list: list[int]
    block_size: int
    # Per sequence, the [start, end) positions of spans whose tokens attend to each other both
    # ways (a Gemma 3 image's soft tokens); None, the text-only common case: causal everywhere.
    bidirectional: list[list[tuple[int, int]]] | None = None
    # Per sequence, its recurrent-state slot (engine/kv/state.py) for layers whose memory is a
    # state rather than K/V (Gated DeltaNet); None for models without such layers.
    state_slots: torch.Tensor | None = None
    # [3, T] M-RoPE positions (Qwen2.5-VL: temporal, height, width of each token; text tokens
    # carry one value thrice, shifted past the images before them); None: the positions alone.
    rope_positions: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_list)

    @property
    def is_decode_only(self) -> bool:
        return self.query_lens_list.count(1) == len(self.query_lens_list)  # per layer: no generator
