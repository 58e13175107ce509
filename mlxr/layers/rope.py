"""Rotary position embedding (the "rotate half" layout of Hugging Face checkpoints)."""
from __future__ import annotations

import math

import torch
from torch import nn

from mlxr.layers.yarn import yarn_inv_freq
from mlxr.model_config import RopeScaling
from mlxr.ops.rotary.rotary import rope_cos_sin, rotary_embedding


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
    if scaling.rope_type == "longrope":
        return inv_freq / _longrope_factors(scaling.short_factor, head_dim)
    if scaling.rope_type == "yarn":
        return yarn_inv_freq(head_dim, theta, scaling.factor, scaling.original_max_position_embeddings,
                             scaling.beta_fast, scaling.beta_slow, scaling.truncate)
    raise ValueError(f"unsupported rope scaling {scaling.rope_type!r}")


def _longrope_factors(factors: tuple[float, ...], head_dim: int) -> torch.Tensor:
    if len(factors) != head_dim // 2:
        raise ValueError(f"longrope needs {head_dim // 2} factors, got {len(factors)}")
    return torch.tensor(factors, dtype=torch.float32)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None = None) -> None:
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.reset_buffers(None)

    @property
    def attention_factor(self) -> float:
        """Scale of cos and sin (longrope, yarn); callers fold its square into the attention scale."""
        return self.scaling.attention_factor if self.scaling is not None else 1.0

    def reset_buffers(self, device: torch.device | None) -> None:
        """(Re)compute the frequencies, e.g. after the model was built on the meta device."""
        inv_freq = inverse_frequencies(self.head_dim, self.theta, self.scaling)
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)
        long = None
        if self.scaling is not None and self.scaling.rope_type == "longrope":
            base = inverse_frequencies(self.head_dim, self.theta, None)
            long = (base / _longrope_factors(self.scaling.long_factor, self.head_dim)).to(device)
        self.register_buffer("long_inv_freq", long, persistent=False)  # None: one set of frequencies

    def frequencies(self, positions: torch.Tensor) -> torch.Tensor:
        """inv_freq for this step. longrope takes the long factors for the whole step once any
        position reaches original_max_position_embeddings (transformers' rule), chosen on the
        device so that no sync or graph break happens; a batch thus shares one choice."""
        if self.long_inv_freq is None:
            return self.inv_freq
        past = positions.max() >= self.scaling.original_max_position_embeddings
        return torch.where(past, self.long_inv_freq, self.inv_freq)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin tables [T, 1, head_dim] for the given positions, in fp32 then cast."""
        return rope_cos_sin(positions, self.inv_freq, dtype)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, D] and k [T, KH, D] rotated by their positions [T]."""
        return rotary_embedding(q, k, positions, self.inv_freq)
