"""Paged attention layer and the metadata the runner passes to every forward."""
from __future__ import annotations


import torch
from torch import nn

from mlxr.ops.attention.attn_metadata import AttnMetadata  # noqa: F401 - the layer's argument, re-exported
from mlxr.ops.attention.paged_attention import paged_attention, write_kv
from mlxr.ops.attention.kv_quant import hadamard, is_rotated
from mlxr.ops.rotary.rotary import rotary_embedding, rotary_write_kv_query


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
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """With positions and rotary frequencies, q and k are rotated first, in one fused op
        with the cache write. sinks: one logit per query head counted in every softmax (gpt-oss)."""
        k_cache, v_cache = kv_cache
        if is_rotated(k_cache, q.shape[-1]):
            return self._attend_turned(q, k, v, kv_cache, meta, positions, inv_freq, sinks)
        if inv_freq is None:
            write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        else:
            q = rotary_write_kv_query(q, k, v, positions, inv_freq, k_cache, v_cache, meta.slot_mapping)
        return self.attend(q, kv_cache, meta, sinks)

    def _attend_turned(self, q, k, v, kv_cache, meta, positions, inv_freq, sinks=None) -> torch.Tensor:
        """A cache of rows turned by the Hadamard matrix (ops/attention/kv_quant.py): K and V are
        stored turned, q turned attends over them, the output is turned back."""
        if inv_freq is not None:
            q, k = rotary_embedding(q, k, positions, inv_freq)
        h = hadamard(q.shape[-1], q.dtype, q.device)
        write_kv(k @ h, v @ h, kv_cache[0], kv_cache[1], meta.slot_mapping)
        return self.attend((q @ h).contiguous(), kv_cache, meta, sinks) @ h

    def attend(self, q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttnMetadata,
               sinks: torch.Tensor | None = None) -> torch.Tensor:
        """Attention over the cache alone, for callers that already stored this step's K/V."""
        return paged_attention(q, kv_cache[0], kv_cache[1], meta, self.scale, self.sliding_window, self.softcap,
                               sinks)
