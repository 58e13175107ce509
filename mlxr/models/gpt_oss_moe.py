"""gpt-oss's mixture of experts: a router with a bias whose top-k logits are softmaxed (the
choice before the softmax, unlike Mixtral's), experts with biases, and the clamped SwiGLU
(gate capped at `limit` from above, up clamped to +-limit, out = (up + 1) * gate * sigmoid(alpha
* gate)). Expert weights are float [E, out, in] or MXFP4 blocks kept 4-bit [E, out, in // 32 * 17]
(ops/quant/mxfp4.py), as gpt-oss ships them and GGUF stores them.

Checkpoint layout (transformers' GptOssExperts): gate_up_proj [E, H, 2I] with gate and up
interleaved column by column; `from_hf_experts` splits it into our gate and up rows."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mlxr.ops.quant.mxfp4 import mxfp4_matmul, row_bytes

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # gpt-oss's config defaults


class ExpertWeight(nn.Module):
    """One projection of every expert: float [E, out, in], or MXFP4 blocks [E, out, in // 32 * 17]."""

    def __init__(self, experts: int, out_features: int, in_features: int, mxfp4: bool) -> None:
        super().__init__()
        self.in_features, self.mxfp4 = in_features, mxfp4
        if mxfp4:
            self.register_buffer("blocks", torch.zeros(experts, out_features, row_bytes(in_features), dtype=torch.uint8))
        else:
            self.weight = nn.Parameter(torch.zeros(experts, out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(experts, out_features), requires_grad=False)

    def forward(self, x: torch.Tensor, expert: int) -> torch.Tensor:
        if self.mxfp4:
            return mxfp4_matmul(x, self.blocks[expert], self.in_features) + self.bias[expert]
        return F.linear(x, self.weight[expert], self.bias[expert])


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, alpha: float = SWIGLU_ALPHA,
                   limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


class GptOssMoE(nn.Module):
    def __init__(self, hidden: int, intermediate: int, experts: int, top_k: int, *, mxfp4: bool = False,
                 alpha: float = SWIGLU_ALPHA, limit: float = SWIGLU_LIMIT) -> None:
        super().__init__()
        self.top_k, self.alpha, self.limit = top_k, alpha, limit
        self.router = nn.Linear(hidden, experts, bias=True)
        self.gate_proj = ExpertWeight(experts, intermediate, hidden, mxfp4)
        self.up_proj = ExpertWeight(experts, intermediate, hidden, mxfp4)
        self.down_proj = ExpertWeight(experts, hidden, intermediate, mxfp4)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, ids = torch.topk(self.router(x), self.top_k, dim=-1)
        return torch.softmax(top.float(), dim=-1).to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.route(flat)
        out = torch.zeros_like(flat)
        for expert in torch.unique(ids).tolist():
            token, slot = torch.where(ids == expert)
            h = flat[token]
            act = clamped_swiglu(self.gate_proj(h, expert), self.up_proj(h, expert), self.alpha, self.limit)
            out.index_add_(0, token, self.down_proj(act, expert) * weights[token, slot, None])
        return out.reshape(x.shape)


def from_hf_experts(gate_up: torch.Tensor, down: torch.Tensor) -> dict[str, torch.Tensor]:
    """transformers' gate_up_proj [E, H, 2I] (interleaved) and down_proj [E, I, H] -> our
    [E, out, in] gate, up and down weights."""
    return {"gate": gate_up[..., ::2].transpose(1, 2).contiguous(),
            "up": gate_up[..., 1::2].transpose(1, 2).contiguous(),
            "down": down.transpose(1, 2).contiguous()}
