"""Idefics3 and SmolVLM (transformers' Idefics3ForConditionalGeneration and
SMolVLMForConditionalGeneration, the same math): a SigLIP tower (vision/vit.py, with Idefics3's
bucketed positions) run on each tile of an image, the connector (a pixel shuffle merging
scale_factor x scale_factor patches into one token, then one matrix without bias), and a Llama
language model. Each tile's tokens replace one run of `<image>` placeholders; the prompt's tile
layout (vision/tiles.py) is text. Causal attention throughout."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.hf_config import no_sliding, positive
from mlxr.model_config import ModelArgs, VisionArgs
from mlxr.models.arch import Architecture
from mlxr.models.vision.llama_vlm import LlamaWithVision, llama_text_config
from mlxr.models.vision.vit import VisionTransformer


class ModalityProjection(nn.Module):
    def __init__(self, v: VisionArgs, text_hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(v.hidden_size * v.scale_factor**2, text_hidden, bias=False)


class Idefics3Connector(nn.Module):
    def __init__(self, v: VisionArgs, text_hidden: int) -> None:
        super().__init__()
        self.scale = v.scale_factor
        self.modality_projection = ModalityProjection(v, text_hidden)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.modality_projection.proj(pixel_shuffle(patches, self.scale))


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """[B, side*side, D] -> [B, side*side / scale^2, D * scale^2], as transformers' connector
    regroups them (columns first, then rows)."""
    b, seq, d = x.shape
    side = int(seq**0.5)
    x = x.view(b, side, side // scale, d * scale).permute(0, 2, 1, 3)
    x = x.reshape(b, side // scale, side // scale, d * scale * scale).permute(0, 2, 1, 3)
    return x.reshape(b, seq // (scale * scale), d * scale * scale)


class Idefics3ForConditionalGeneration(LlamaWithVision):
    def __init__(self, args: ModelArgs) -> None:
        assert args.vision is not None
        super().__init__(args, VisionTransformer(args.vision), Idefics3Connector(args.vision, args.hidden_size))


def _hf_config(config: dict) -> dict:
    return llama_text_config(config, "Idefics3")


def image_tokens(image_size: int, patch_size: int, scale: int, where: str) -> int:
    """One tile's tokens; ModelFormatError where the patch grid does not shuffle evenly."""
    side = image_size // patch_size
    if image_size % patch_size or side % scale:
        raise ModelFormatError(f"{where}: image_size {image_size} is not a whole number of {patch_size}-pixel "
                               f"patches merged {scale} a side")
    return (side // scale) ** 2


def _hf_vision(config: dict) -> dict[str, Any]:
    v = config["vision_config"]
    if v.get("model_type", "idefics3_vision") not in ("idefics3_vision", "smolvlm_vision"):
        raise UnsupportedModelError(f"an Idefics3 tower of type {v.get('model_type')!r} is not supported")
    act = v.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh", "gelu"):
        raise UnsupportedModelError(f"Idefics3 tower hidden_act {act!r} is not supported")
    image, patch = positive(v, "image_size", 224), positive(v, "patch_size", 32)
    scale = positive(config, "scale_factor", 2)
    hidden, heads = positive(v, "hidden_size", 1152), positive(v, "num_attention_heads", 16)
    if hidden % heads:
        raise ModelFormatError(f"config.json: vision hidden_size {hidden} does not split into {heads} heads")
    return {
        "tower": "idefics3", "projector": "idefics3", "hidden_size": hidden,
        "intermediate_size": positive(v, "intermediate_size", 3072),
        "num_hidden_layers": positive(v, "num_hidden_layers", 12), "num_attention_heads": heads,
        "image_size": image, "patch_size": patch, "layer_norm_eps": float(v.get("layer_norm_eps") or 1e-6),
        "hidden_act": act, "num_channels": positive(v, "num_channels", 3),
        "tokens_per_image": image_tokens(image, patch, scale, "config.json"),
        "image_token_id": positive(config, "image_token_id", 128257),
        "image_marker": "<image>", "image_sequence": "{image}", "image_token": "<image>",
        "tiled": True, "scale_factor": scale,
    }


MODEL = Idefics3ForConditionalGeneration
ARCH = Architecture("idefics3", ("idefics3", "smolvlm"), (), hf_config=_hf_config, hf_vision=_hf_vision,
                    hf_sliding=no_sliding, hf_max_positions=8192)
