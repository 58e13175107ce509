"""Sparse mixture-of-experts feed-forward (Mixtral, Qwen3-MoE): a router picks top-k experts per
token; each expert is a gated MLP. Expert weights are stacked: gate/up [E, I, H], down [E, H, I].

On the CPU the tokens are grouped by expert and each expert runs one matmul over its group. On
CUDA the fused Triton kernels (ops/moe/moe_triton.py) do the grouping and both GEMMs without a host
sync (SiLU models). Elsewhere, or with MLXR_KERNELS=reference, every expert runs over every token
and the router's weights (zero where not chosen) mix the results: E/k times the work, but again
no host sync, so CUDA graphs can capture it. Expert weights a GGUF file holds quantized stay
as its blocks (quant_linear.QuantStacked), multiplied per expert by the quantized matmul kernels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mlxr.layers.linear import Linear
from mlxr.layers.mlp import ACTIVATIONS
from mlxr.ops.activation.activation import gated_activation
from mlxr.ops.backend import use_triton


class Stacked(nn.Module):
    """One weight matrix per expert, [E, out, in] (a module so the parameter is `.weight`)."""

    def __init__(self, num_experts: int, out_features: int, in_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, out_features, in_features), requires_grad=False)

    def matmul(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        """rows @ W_e^T"""
        return rows @ self.weight[e].t()


class Experts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        e, h, i = num_experts, hidden_size, intermediate_size
        self.gate_proj, self.up_proj, self.down_proj = Stacked(e, i, h), Stacked(e, i, h), Stacked(e, h, i)


class SparseMoE(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 act: str, norm_topk_prob: bool) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"top_k {top_k} must be in 1..{num_experts}")
        self.gate = Linear(hidden_size, num_experts, bias=False)  # the router
        self.experts = Experts(num_experts, hidden_size, intermediate_size)
        self.num_experts, self.top_k, self.norm_topk_prob, self.act = num_experts, top_k, norm_topk_prob, ACTIVATIONS[act]

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] in x's dtype, expert ids [T, k]): softmax in fp32, then top-k."""
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(x, *self.route(x))

    def mix(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The chosen experts' outputs on x, weighted (Gemma 4 routes on another input than x)."""
        if x.is_cpu:
            return self._grouped(x, weights, ids)
        w = self.experts
        dense = isinstance(w.gate_proj, Stacked) and isinstance(w.up_proj, Stacked) and isinstance(w.down_proj, Stacked)
        if dense and self.act == "silu" and use_triton(x, w.gate_proj.weight):
            from mlxr.ops.moe.moe_triton import fused_moe_silu

            return fused_moe_silu(x, w.gate_proj.weight, w.up_proj.weight, w.down_proj.weight, weights, ids)
        return self._dense(x, weights, ids)

    def _expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        w = self.experts
        gate, up = w.gate_proj.matmul(e, rows), w.up_proj.matmul(e, rows)
        return w.down_proj.matmul(e, gated_activation(gate, up, self.act))

    def _grouped(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // self.top_k
        rows = x.index_select(0, token)
        out = torch.empty_like(rows)
        start = 0
        for e, n in enumerate(torch.bincount(flat, minlength=self.num_experts).tolist()):
            if n:
                out[start:start + n] = self._expert(e, rows[start:start + n])
                start += n
        out *= weights.reshape(-1)[order].unsqueeze(1)
        return torch.zeros_like(x).index_add_(0, token, out)

    def _dense(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        n_experts = self.num_experts
        mix = torch.zeros(x.shape[0], n_experts, dtype=x.dtype, device=x.device).scatter_(1, ids, weights)
        out = torch.zeros_like(x)
        for e in range(n_experts):
            out += self._expert(e, x) * mix[:, e:e + 1]
        return out
