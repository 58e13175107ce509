"""Rotary position embedding (the "rotate half" layout of Hugging Face checkpoints)."""
from __future__ import annotations

import math

import torch
from torch import nn

from mlxr.config import RopeScaling
from mlxr.ops.rotary import rope_cos_sin, rotary_embedding


def llama3_inv_freq(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1 frequency scaling: long wavelengths slowed by `factor`, a smooth ramp between."""
    old_len = s.original_max_position_embeddings
    low_wavelen = old_len / s.low_freq_factor
    high_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None or scaling.rope_type == "default":
        return inv_freq
    if scaling.rope_type == "llama3":
        return llama3_inv_freq(inv_freq, scaling)
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    raise ValueError(f"unsupported rope scaling {scaling.rope_type!r}")


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None = None) -> None:
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.reset_buffers(None)

    def reset_buffers(self, device: torch.device | None) -> None:
        """(Re)compute the frequencies, e.g. after the model was built on the meta device."""
        inv_freq = inverse_frequencies(self.head_dim, self.theta, self.scaling)
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin tables [T, 1, head_dim] for the given positions, in fp32 then cast."""
        return rope_cos_sin(positions, self.inv_freq, dtype)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, D] and k [T, KH, D] rotated by their positions [T]."""
        return rotary_embedding(q, k, positions, self.inv_freq)
