"""gpt-oss's mixture of experts: a router with a bias whose top-k logits are softmaxed (the
choice before the softmax, unlike Mixtral's), experts with biases, and the clamped SwiGLU
(gate capped at `limit` from above, up clamped to +-limit, out = (up + 1) * gate * sigmoid(alpha
* gate)). Expert weights are float [E, out, in] here; MXFP4 blocks kept 4-bit replace them at
load (layers/quant_linear.QuantStacked of type MXFP4, ops/quant/mxfp4.py), as gpt-oss ships
them and GGUF stores them.

Checkpoint layout (transformers' GptOssExperts): gate_up_proj [E, H, 2I] with gate and up
interleaved column by column; `from_hf_experts` splits it into our gate and up rows."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # gpt-oss's config defaults


class BiasedStacked(nn.Module):
    """One projection of every expert: weight [E, out, in], bias [E, out]."""

    def __init__(self, experts: int, out_features: int, in_features: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.weight = nn.Parameter(torch.zeros(experts, out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(experts, out_features), requires_grad=False)

    def matmul(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        return F.linear(rows, self.weight[e], self.bias[e])


class GptOssExperts(nn.Module):
    def __init__(self, experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = BiasedStacked(experts, intermediate, hidden)
        self.up_proj = BiasedStacked(experts, intermediate, hidden)
        self.down_proj = BiasedStacked(experts, hidden, intermediate)


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, alpha: float = SWIGLU_ALPHA,
                   limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


class GptOssMoE(nn.Module):
    def __init__(self, hidden: int, intermediate: int, experts: int, top_k: int, *,
                 alpha: float = SWIGLU_ALPHA, limit: float = SWIGLU_LIMIT) -> None:
        super().__init__()
        if not 0 < top_k <= experts:
            raise ValueError(f"top_k {top_k} must be in 1..{experts}")
        self.top_k, self.alpha, self.limit = top_k, alpha, limit
        self.router = nn.Linear(hidden, experts, bias=True)
        self.experts = GptOssExperts(experts, hidden, intermediate)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, ids = torch.topk(self.router(x), self.top_k, dim=-1)
        return torch.softmax(top.float(), dim=-1).to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.route(flat)
        w = self.experts
        out = torch.zeros_like(flat)
        for expert in torch.unique(ids).tolist():
            token, slot = torch.where(ids == expert)
            h = flat[token]
            act = clamped_swiglu(w.gate_proj.matmul(expert, h), w.up_proj.matmul(expert, h), self.alpha, self.limit)
            out.index_add_(0, token, w.down_proj.matmul(expert, act) * weights[token, slot, None])
        return out.reshape(x.shape)


def from_hf_experts(gate_up: torch.Tensor, down: torch.Tensor) -> dict[str, torch.Tensor]:
    """transformers' gate_up_proj [E, H, 2I] (interleaved) and down_proj [E, I, H] -> our
    [E, out, in] gate, up and down weights."""
    return {"gate": gate_up[..., ::2].transpose(1, 2).contiguous(),
            "up": gate_up[..., 1::2].transpose(1, 2).contiguous(),
            "down": down.transpose(1, 2).contiguous()}
