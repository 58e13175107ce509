"""Gemma 3 with images (transformers' Gemma3ForConditionalGeneration): a SigLIP tower, then the
projector (average pooling of the patch grid down to tokens_per_image, Gemma's RMS norm, one
matrix into the text width); the language model is gemma3.py's. An image's soft tokens attend
to each other both ways (VisionArgs.bidirectional; the attention reads the spans from the
metadata)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mlxr.layers.attention import AttnMetadata
from mlxr.layers.norm import GemmaRMSNorm
from mlxr.model_config import ModelArgs, VisionArgs
from mlxr.models.gemma3 import Gemma3ForCausalLM
from mlxr.models.llama import KVCache
from mlxr.models.vision.vit import VisionTransformer


class Gemma3Projector(nn.Module):
    def __init__(self, v: VisionArgs, text_hidden: int) -> None:
        super().__init__()
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(v.hidden_size, text_hidden))
        self.mm_soft_emb_norm = GemmaRMSNorm(v.hidden_size, v.layer_norm_eps)
        self.patches_per_side = v.image_size // v.patch_size
        self.kernel = self.patches_per_side // math.isqrt(v.tokens_per_image)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        b, _, d = patches.shape
        side = self.patches_per_side
        grid = patches.transpose(1, 2).reshape(b, d, side, side)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)  # [B, tokens, D]
        normed = self.mm_soft_emb_norm(pooled.reshape(-1, d)).view(b, -1, d)
        return torch.matmul(normed, self.mm_input_projection_weight.to(normed.dtype))


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args)
        assert args.vision is not None
        self.vision_tower = VisionTransformer(args.vision)
        self.multi_modal_projector = Gemma3Projector(args.vision, args.hidden_size)

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, 3, H, W] -> the image tokens' embeddings [N, tokens_per_image, hidden]."""
        return self.multi_modal_projector(self.vision_tower(pixels))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttnMetadata,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta, inputs_embeds)


MODEL = Gemma3ForConditionalGeneration
