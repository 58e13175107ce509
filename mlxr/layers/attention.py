"""Paged attention layer and the metadata the runner passes to every forward."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mlxr.ops.paged_attention import paged_attention, write_kv
from mlxr.ops.rotary import rotary_write_kv_query


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

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_list)

    @property
    def is_decode_only(self) -> bool:
        return self.query_lens_list.count(1) == len(self.query_lens_list)  # per layer: no generator


class PagedAttention(nn.Module):
    """Writes this step's K/V into the paged cache, then attends over the cache."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        sliding_window: int | None = None,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        assert num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.softcap = softcap

    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttnMetadata,
        positions: torch.Tensor | None = None,
        inv_freq: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """With positions and rotary frequencies, q and k are rotated first, in one fused op
        with the cache write."""
        k_cache, v_cache = kv_cache
        if inv_freq is None:
            write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        else:
            q = rotary_write_kv_query(q, k, v, positions, inv_freq, k_cache, v_cache, meta.slot_mapping)
        return self.attend(q, kv_cache, meta)

    def attend(self, q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttnMetadata) -> torch.Tensor:
        """Attention over the cache alone, for callers that already stored this step's K/V."""
        return paged_attention(q, kv_cache[0], kv_cache[1], meta, self.scale, self.sliding_window, self.softcap)
