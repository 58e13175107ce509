"""The gated feed-forward block shared by every supported model."""
from __future__ import annotations

import torch
from torch import nn

from mlxr.layers.fused_linear import merge_linears
from mlxr.layers.linear import Linear
from mlxr.ops.activation.activation import gated_activation, gated_activation_cat

# Config activation name -> the ops' activation kind.
ACTIVATIONS = {
    "silu": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu_tanh",  # Gemma configs say gelu, mean tanh
}


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, act: str) -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"unsupported activation {act!r}")
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)
        self.act = ACTIVATIONS[act]
        self.gate_up_proj: nn.Module | None = None  # gate and up in one matrix (fuse_projections)

    def fuse_projections(self) -> bool:
        merged = merge_linears([self.gate_proj, self.up_proj])
        if merged is not None:
            self.gate_up_proj, self.gate_proj, self.up_proj = merged, None, None
        return merged is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            return self.down_proj(gated_activation_cat(self.gate_up_proj(x), self.act))
        return self.down_proj(gated_activation(self.gate_proj(x), self.up_proj(x), self.act))
