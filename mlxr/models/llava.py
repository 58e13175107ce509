"""LLaVA (transformers' LlavaForConditionalGeneration): a CLIP tower (vision/clip.py), a two-layer
MLP projector, and a Llama language model whose prompt holds one `<image>` placeholder per patch
feature. Causal attention throughout (no bidirectional image spans)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mlxr.config import ModelArgs, VisionArgs
from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.hf_config import no_sliding, positive
from mlxr.layers.attention import AttnMetadata
from mlxr.models.arch import Architecture
from mlxr.models.llama import KVCache, LlamaForCausalLM
from mlxr.models.vision.clip import ClipVisionTransformer

_ACTS = {"gelu": F.gelu, "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x)}


class LlavaProjector(nn.Module):
    def __init__(self, v: VisionArgs, text_hidden: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(v.hidden_size, text_hidden)
        self.linear_2 = nn.Linear(text_hidden, text_hidden)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.gelu(self.linear_1(features)))


class LlavaForConditionalGeneration(LlamaForCausalLM):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args)
        assert args.vision is not None
        self.vision_tower = ClipVisionTransformer(args.vision)
        self.multi_modal_projector = LlavaProjector(args.vision, args.hidden_size)

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, 3, H, W] -> the image tokens' embeddings [N, patches, hidden]."""
        return self.multi_modal_projector(self.vision_tower(pixels))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                meta: AttnMetadata, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta, inputs_embeds)


def _hf_config(config: dict) -> dict:
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ModelFormatError("config.json of model_type 'llava' lacks a text_config object")
    if text.get("model_type", "llama") != "llama":
        raise UnsupportedModelError(f"LLaVA with a {text.get('model_type')!r} language model is not supported")
    return {"tie_word_embeddings": config.get("tie_word_embeddings", False), **text}


def _hf_vision(config: dict) -> dict[str, Any]:
    v = config["vision_config"]
    if v.get("model_type", "clip_vision_model") != "clip_vision_model":
        raise UnsupportedModelError(f"a LLaVA tower of type {v.get('model_type')!r} is not supported")
    if config.get("vision_feature_select_strategy", "default") != "default" or not isinstance(
            config.get("vision_feature_layer", -2), int):
        raise UnsupportedModelError("LLaVA: only vision_feature_select_strategy 'default' and one feature layer")
    if config.get("projector_hidden_act", "gelu") != "gelu" or config.get("multimodal_projector_bias", True) is False:
        raise UnsupportedModelError("LLaVA: only a gelu projector with biases is supported")
    act = v.get("hidden_act", "quick_gelu")
    if act not in _ACTS:
        raise UnsupportedModelError(f"LLaVA tower hidden_act {act!r} is not supported")
    image, patch = positive(v, "image_size", 224), positive(v, "patch_size", 32)
    return {
        "tower": "clip", "projector": "llava",
        "hidden_size": positive(v, "hidden_size", 768), "intermediate_size": positive(v, "intermediate_size", 3072),
        "num_hidden_layers": positive(v, "num_hidden_layers", 12),
        "num_attention_heads": positive(v, "num_attention_heads", 12),
        "image_size": image, "patch_size": patch, "layer_norm_eps": float(v.get("layer_norm_eps") or 1e-5),
        "hidden_act": act, "num_channels": positive(v, "num_channels", 3),
        "tokens_per_image": (image // patch) ** 2,
        "image_token_id": positive(config, "image_token_index", 32000),
        "image_marker": "<image>", "image_sequence": "{image}", "image_token": "<image>",
        "feature_layer": int(config.get("vision_feature_layer", -2)),
    }


MODEL = LlavaForConditionalGeneration
ARCH = Architecture("llava", ("llava",), (), hf_config=_hf_config, hf_vision=_hf_vision, hf_sliding=no_sliding,
                    hf_max_positions=4096)
