"""The gated activation act(gate) * up of the MLP block: torch reference and dispatcher."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mlxr.ops.backend import use_triton



def activation_reference(x: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "silu":
        return F.silu(x)
    if kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    raise ValueError(f"unsupported activation {kind!r}")


def gated_activation(gate: torch.Tensor, up: torch.Tensor, kind: str) -> torch.Tensor:
    """act(gate) * up for two [..., I] inputs."""
    if not gate.is_cpu and gate.dtype == up.dtype and gate.shape == up.shape and use_triton(gate, up):
        from mlxr.ops.activation.activation_triton import gated_activation_triton

        return gated_activation_triton(gate, up, kind)
    return activation_reference(gate, kind) * up


def gated_activation_cat(x: torch.Tensor, kind: str) -> torch.Tensor:
    """act(x[..., :I]) * x[..., I:] for one [..., 2I] input (fused gate/up projection)."""
    inter = x.shape[-1] // 2
    return gated_activation(x[..., :inter], x[..., inter:], kind)
