"""LLaVA (transformers' LlavaForConditionalGeneration): a CLIP tower (vision/clip.py), a two-layer
MLP projector, and a Llama language model whose prompt holds one `<image>` placeholder per patch
feature. Causal attention throughout (no bidirectional image spans)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mlxr.errors import UnsupportedModelError
from mlxr.formats.hf_config import no_sliding, positive
from mlxr.model_config import ModelArgs, VisionArgs
from mlxr.models.arch import Architecture
from mlxr.models.vision.clip import ClipVisionTransformer
from mlxr.models.vision.llama_vlm import LlamaWithVision, llama_text_config

_ACTS = {"gelu": F.gelu, "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x)}


class LlavaProjector(nn.Module):
    def __init__(self, v: VisionArgs, text_hidden: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(v.hidden_size, text_hidden)
        self.linear_2 = nn.Linear(text_hidden, text_hidden)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.gelu(self.linear_1(features)))


class LlavaForConditionalGeneration(LlamaWithVision):
    def __init__(self, args: ModelArgs) -> None:
        assert args.vision is not None
        super().__init__(args, ClipVisionTransformer(args.vision), LlavaProjector(args.vision, args.hidden_size))


def _hf_config(config: dict) -> dict:
    return llama_text_config(config, "LLaVA")


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
