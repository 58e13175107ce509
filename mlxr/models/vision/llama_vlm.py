"""A Llama language model whose prompt takes image tokens: a tower and a projector beside it
(LLaVA, Idefics3 / SmolVLM). The families differ in the tower and the projector only."""
from __future__ import annotations

import torch
from torch import nn

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.layers.attention import AttnMetadata
from mlxr.model_config import ModelArgs
from mlxr.models.llama import KVCache, LlamaForCausalLM


class LlamaWithVision(LlamaForCausalLM):
    def __init__(self, args: ModelArgs, tower: nn.Module, projector: nn.Module) -> None:
        super().__init__(args)
        assert args.vision is not None
        self.vision_tower = tower
        self.multi_modal_projector = projector

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """images (or tiles) [N, 3, H, W] -> their tokens' embeddings [N, tokens per image, hidden]."""
        return self.multi_modal_projector(self.vision_tower(pixels))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                meta: AttnMetadata, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta, inputs_embeds)


def llama_text_config(config: dict, family: str) -> dict:
    """The language model's config.json fields from a vision model's `text_config` (a Llama)."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ModelFormatError(f"config.json of model_type {config.get('model_type')!r} lacks a text_config object")
    if text.get("model_type", "llama") != "llama":
        raise UnsupportedModelError(f"{family} with a {text.get('model_type')!r} language model is not supported")
    return {"tie_word_embeddings": config.get("tie_word_embeddings", False), **text}
