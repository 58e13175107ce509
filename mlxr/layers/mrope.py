"""Multimodal RoPE (Qwen2.5-VL): the head's rotary pairs split into sections turned by the token's
temporal, height and width positions in turn (transformers' Qwen2_5_VLRotaryEmbedding); a text
token carries one position thrice, which is plain RoPE."""
from __future__ import annotations

import torch

from mlxr.ops.rotary.rotary import rotate_half


def mrope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, section: tuple[int, ...],
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [3, T] -> cos and sin [T, 1, head_dim], computed in fp32 then cast."""
    angles = positions[..., None].float() * inv_freq.float()  # [3, T, head_dim / 2]
    picked = torch.cat([part[i % 3] for i, part in enumerate(angles.split(list(section), dim=-1))], dim=-1)
    full = torch.cat([picked, picked], dim=-1)[:, None, :]
    return full.cos().to(dtype), full.sin().to(dtype)


def apply_mrope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
