"""Gated DeltaNet: linear attention whose per-sequence memory is a fixed-size state (Qwen3.5's
"linear_attention" layers). A short causal convolution over the projected q/k/v, then the gated
delta rule (ops/delta_rule), then an RMSNorm gated by a SiLU of a further projection.

The layer's `kv_cache` argument is its pair of state pools, owned by the engine's KV manager
(engine/kv/state.py): conv [slots, conv_dim, K - 1] and delta [slots, Hv, Dk, Dv], fp32; row s of
the step reads and writes slot meta.state_slots[s], in place. A row with no computed tokens before
this step starts from zeros (a fresh or recomputed request), whatever its slot held.
"""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

from mlxr.layers.linear import Linear
from mlxr.ops.attention.attn_metadata import AttnMetadata
from mlxr.ops.delta_rule.dispatch import conv_prefill, conv_step, gated_delta_chunked, gated_delta_step


class DepthwiseConv(nn.Module):
    """The checkpoint's conv1d weight [channels, 1, K] (no bias)."""

    def __init__(self, channels: int, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, width), requires_grad=False)


class GatedRMSNorm(nn.Module):
    """weight * norm(x) (cast back) * silu(gate), per value head."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (self.weight * normed * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, hidden_size: int, num_k_heads: int, num_v_heads: int, k_head_dim: int, v_head_dim: int,
                 conv_width: int, eps: float) -> None:
        super().__init__()
        if num_v_heads % num_k_heads:
            raise ValueError(f"linear value heads {num_v_heads} must be a multiple of key heads {num_k_heads}")
        self.hk, self.hv, self.dk, self.dv = num_k_heads, num_v_heads, k_head_dim, v_head_dim
        key_dim, value_dim = num_k_heads * k_head_dim, num_v_heads * v_head_dim
        self.conv_dim = 2 * key_dim + value_dim
        self.in_proj_qkv = Linear(hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = Linear(hidden_size, value_dim, bias=False)
        self.in_proj_b = Linear(hidden_size, num_v_heads, bias=False)
        self.in_proj_a = Linear(hidden_size, num_v_heads, bias=False)
        self.conv1d = DepthwiseConv(self.conv_dim, conv_width)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(num_v_heads))
        self.norm = GatedRMSNorm(v_head_dim, eps)
        self.out_proj = Linear(value_dim, hidden_size, bias=False)

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """One sequence's (conv state, delta state) shapes."""
        return (self.conv_dim, self.conv1d.weight.shape[-1] - 1), (self.hv, self.dk, self.dv)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: AttnMetadata) -> torch.Tensor:
        qkv = self.in_proj_qkv(x)
        beta = torch.sigmoid(self.in_proj_b(x).float())
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())
        if meta.is_decode_only:
            o = self._decode(qkv, g, beta, kv_cache, meta)
        else:
            o = self._rows(qkv, g, beta, kv_cache, meta)
        z = self.in_proj_z(x).view(-1, self.hv, self.dv)
        o = self.norm(o.to(x.dtype), z)
        return self.out_proj(o.reshape(x.shape[0], -1))

    def _split(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of q, k [T, Hk, Dk] and v [T, Hv, Dv] (each key head serving Hv / Hk consecutive value
        heads: the delta rule's dispatcher maps them)."""
        t, key_dim = mixed.shape[0], self.hk * self.dk
        q, k, v = mixed.split([key_dim, key_dim, self.hv * self.dv], dim=-1)
        return q.reshape(t, self.hk, self.dk), k.reshape(t, self.hk, self.dk), v.reshape(t, self.hv, self.dv)

    def _decode(self, qkv, g, beta, kv_cache, meta: AttnMetadata) -> torch.Tensor:
        """One token a row, every row's state advanced in place in its slot; a row at its first
        token (context length 1 on the device: no host read, so a CPU graph can replay it)
        starts from zeros."""
        conv_pool, delta_pool = kv_cache
        slots, lens = meta.state_slots, meta.seq_lens
        mixed = conv_step(qkv, conv_pool, slots, self.conv1d.weight[:, 0, :], lens)
        q, k, v = self._split(mixed)
        return gated_delta_step(q, k, v, g, beta, delta_pool, slots, lens)

    def _rows(self, qkv, g, beta, kv_cache, meta: AttnMetadata) -> torch.Tensor:
        """Row by row: each sequence's chunk through the chunked scan from its own state, in its slot."""
        conv_pool, delta_pool = kv_cache
        weight = self.conv1d.weight[:, 0, :]
        outs = []
        starts = itertools.accumulate(meta.query_lens_list, initial=0)
        for s, (start, n, total) in enumerate(zip(starts, meta.query_lens_list, meta.seq_lens_list)):
            slot = int(meta.state_slots[s])
            conv_state, delta_state = conv_pool[slot], delta_pool[slot]
            if total == n:  # nothing before this chunk: a fresh state
                conv_state.zero_()
                delta_state.zero_()
            rows = slice(start, start + n)
            q, k, v = self._split(conv_prefill(qkv[rows], conv_state, weight))
            outs.append(gated_delta_chunked(q, k, v, g[rows], beta[rows], delta_state))
        return torch.cat(outs)
