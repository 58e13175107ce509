"""A CLIP ViT image encoder (transformers' CLIPVisionModel), as LLaVA reads it: a class token
and learned positions, a norm before the encoder, the same pre-norm layers as SigLIP's (vit.py),
and the output of a chosen layer (feature_layer, -2 by LLaVA's default) without the class token."""
from __future__ import annotations

import torch
from torch import nn

from mlxr.model_config import VisionArgs
from mlxr.models.vision.vit import Encoder


class ClipEmbeddings(nn.Module):
    def __init__(self, v: VisionArgs) -> None:
        super().__init__()
        self.class_embedding = nn.Parameter(torch.zeros(v.hidden_size))
        self.patch_embedding = nn.Conv2d(v.num_channels, v.hidden_size, v.patch_size, stride=v.patch_size, bias=False)
        self.num_patches = (v.image_size // v.patch_size) ** 2
        self.position_embedding = nn.Embedding(self.num_patches + 1, v.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        weight = self.patch_embedding.weight
        patches = self.patch_embedding(pixels.to(weight.dtype)).flatten(2).transpose(1, 2)  # [B, patches, D]
        cls = self.class_embedding.to(patches.dtype).expand(patches.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embedding.weight.to(patches.dtype)


class ClipVisionTransformer(nn.Module):
    """pixels [B, C, H, W] -> feature_layer's hidden states of the patches [B, patches, D]."""

    def __init__(self, v: VisionArgs) -> None:
        super().__init__()
        self.embeddings = ClipEmbeddings(v)
        self.pre_layrnorm = nn.LayerNorm(v.hidden_size, eps=v.layer_norm_eps)
        self.encoder = Encoder(v)
        self.post_layernorm = nn.LayerNorm(v.hidden_size, eps=v.layer_norm_eps)  # the pooled output's: unused
        # hidden_states[i] is the output of i layers (0: the normed embeddings)
        n = v.num_hidden_layers
        self.layers_run = v.feature_layer if v.feature_layer >= 0 else n + 1 + v.feature_layer

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.pre_layrnorm(self.embeddings(pixels))
        for layer in self.encoder.layers[: self.layers_run]:
            x = layer(x)
        return x[:, 1:]
