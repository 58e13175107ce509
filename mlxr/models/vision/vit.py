"""A ViT image encoder in the anatomy of transformers' SigLIP vision model: patch convolution plus
learned position embeddings, pre-norm encoder layers (biased q/k/v/out projections, full
attention over the patches, a two-layer MLP), a final layer norm. Parameter names are the
checkpoint's below `vision_tower.` (transformers 4 saved them below `vision_tower.vision_model.`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mlxr.model_config import VisionArgs


def _activation(name: str):
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "quick_gelu":
        return lambda x: x * torch.sigmoid(1.702 * x)
    return F.gelu


class PatchEmbeddings(nn.Module):
    def __init__(self, v: VisionArgs) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(v.num_channels, v.hidden_size, v.patch_size, stride=v.patch_size)
        self.side = v.image_size // v.patch_size
        self.num_patches = self.side**2
        self.position_embedding = nn.Embedding(self.num_patches, v.hidden_size)
        self.bucketed = v.tower == "idefics3"

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        weight = self.patch_embedding.weight
        x = self.patch_embedding(pixels.to(weight.dtype)).flatten(2).transpose(1, 2)  # [B, patches, D]
        if self.bucketed:
            return x + self.position_embedding(self._bucketed_positions(pixels.device))
        return x + self.position_embedding.weight.to(x.dtype)

    def _bucketed_positions(self, device: torch.device) -> torch.Tensor:
        """Idefics3's position ids of a whole (unpadded) tile, computed with its float32 ops: each
        patch's fractional coordinate bucketed among the grid's boundaries (rounding can move a
        patch off the plain arange, so the ops are theirs)."""
        n = self.side
        boundaries = torch.arange(1 / n, 1.0, 1 / n, device=device)
        step = 1.0 / torch.tensor([n], device=device)
        coords = torch.clamp(torch.arange(n, device=device, dtype=torch.float32)[None, :] * step[:, None],
                             max=1.0 - 1e-6)
        bucket = torch.bucketize(coords, boundaries, right=True)[0]
        return (bucket[:, None] * n + bucket[None, :]).reshape(-1)


class VisionAttention(nn.Module):
    def __init__(self, v: VisionArgs) -> None:
        super().__init__()
        d = v.hidden_size
        self.heads, self.head_dim = v.num_attention_heads, d // v.num_attention_heads
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (p(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        # Full attention over the patches, no mask: torch's fused kernel (flash on CPU and GPU).
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class VisionMLP(nn.Module):
    def __init__(self, v: VisionArgs) -> None:
        super().__init__()
        self.fc1 = nn.Linear(v.hidden_size, v.intermediate_size)
        self.fc2 = nn.Linear(v.intermediate_size, v.hidden_size)
        self.act = _activation(v.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, v: VisionArgs) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(v.hidden_size, eps=v.layer_norm_eps)
        self.self_attn = VisionAttention(v)
        self.layer_norm2 = nn.LayerNorm(v.hidden_size, eps=v.layer_norm_eps)
        self.mlp = VisionMLP(v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class Encoder(nn.Module):
    def __init__(self, v: VisionArgs) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(v) for _ in range(v.num_hidden_layers))


class VisionTransformer(nn.Module):
    """pixels [B, C, H, W] -> the last hidden states [B, patches, D] (after the final norm)."""

    def __init__(self, v: VisionArgs) -> None:
        super().__init__()
        self.embeddings = PatchEmbeddings(v)
        self.encoder = Encoder(v)
        self.post_layernorm = nn.LayerNorm(v.hidden_size, eps=v.layer_norm_eps)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)
