"""Qwen2.5-VL (transformers' Qwen2_5_VLForConditionalGeneration): its vision tower and merger
(vision/qwen_vit.py) and a Qwen2 language model whose rotary is M-RoPE (layers/mrope.py). An
image's tokens sit at `<|image_pad|>` placeholders, one per 2 x 2 block of patches, its pixels
[3, H, W] at the processor's size (vision/qwen_resize.py). The engine passes the 3-part positions
in AttnMetadata.rope_positions on steps of requests with images (engine/worker/mrope_positions.py);
without them every position is plain (text only: the three parts agree)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.hf_config import positive
from mlxr.layers.attention import AttnMetadata
from mlxr.layers.mrope import apply_mrope, mrope_cos_sin
from mlxr.model_config import ModelArgs
from mlxr.models.arch import Architecture
from mlxr.models.llama import KVCache, LlamaAttention, LlamaBackbone, LlamaBlock, LlamaForCausalLM
from mlxr.models.qwen2 import _hf_sliding
from mlxr.models.vision.qwen_vit import QwenVisionTransformer, flat_patches


class MRopeAttention(LlamaAttention):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__(args, layer)
        assert args.vision is not None
        self.section = args.vision.mrope_section

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, meta: AttnMetadata) -> torch.Tensor:
        if meta.rope_positions is None:
            return super().forward(x, positions, kv_cache, meta)
        q, k, v = self.normed_qkv(x)
        cos, sin = mrope_cos_sin(meta.rope_positions, self.rotary.inv_freq, self.section, q.dtype)
        q, k = apply_mrope(q, k, cos, sin)
        return self.o_proj(self.attn(q.contiguous(), k.contiguous(), v, kv_cache, meta).reshape(x.shape[0], -1))


class MRopeBlock(LlamaBlock):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__(args, layer)
        self.self_attn = MRopeAttention(args, layer)


class MRopeBackbone(LlamaBackbone):
    block_class = MRopeBlock


class Qwen2_5_VLForConditionalGeneration(LlamaForCausalLM):
    backbone_class = MRopeBackbone

    def __init__(self, args: ModelArgs) -> None:
        v = args.vision
        if v is None:
            raise UnsupportedModelError("a Qwen2.5-VL language model runs with its vision tower: give its mmproj file "
                                        "(--mmproj) beside the GGUF")
        super().__init__(args)
        self.visual = QwenVisionTransformer(v, args.hidden_size)
        self.patch, self.merge, self.temporal = v.patch_size, v.scale_factor, v.temporal_patch_size

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, 3, H, W] (one size) -> the image tokens' embeddings [N, H*W/(patch*merge)^2, hidden]."""
        return torch.stack([self.visual(*flat_patches(image, self.patch, self.merge, self.temporal))
                            for image in pixels])

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                meta: AttnMetadata, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta, inputs_embeds)


def _hf_config(config: dict) -> dict:
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ModelFormatError("config.json of model_type 'qwen2_5_vl' lacks a text_config object")
    return {"tie_word_embeddings": config.get("tie_word_embeddings", False), **text}


def _mrope_section(config: dict, head_dim: int) -> tuple[int, ...]:
    text = config.get("text_config") or {}
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    section = params.get("mrope_section") if isinstance(params, dict) else None
    if not isinstance(section, list) or len(section) != 3 or not all(isinstance(s, int) and s > 0 for s in section):
        raise ModelFormatError("qwen2_5_vl: rope_parameters.mrope_section must be three positive integers")
    if sum(section) != head_dim // 2:
        raise ModelFormatError(f"qwen2_5_vl: mrope_section {section} does not cover the head's {head_dim // 2} pairs")
    return tuple(section)


def _hf_vision(config: dict) -> dict[str, Any]:
    v, text = config["vision_config"], config.get("text_config") or {}
    if v.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"Qwen2.5-VL tower hidden_act {v.get('hidden_act')!r} is not supported")
    hidden, heads = positive(v, "hidden_size", 3584), positive(v, "num_heads", 16)
    depth = positive(v, "depth", 32)
    full = tuple(int(i) for i in v.get("fullatt_block_indexes", (7, 15, 23, 31)))
    if any(not 0 <= i < depth for i in full):
        raise ModelFormatError(f"qwen2_5_vl: fullatt_block_indexes {full} outside the {depth} layers")
    if positive(v, "out_hidden_size", 3584) != positive(text, "hidden_size", 3584):
        raise ModelFormatError("qwen2_5_vl: the merger's out_hidden_size differs from the text hidden_size")
    text_heads = positive(text, "num_attention_heads", 28)
    head_dim = text.get("head_dim") or positive(text, "hidden_size", 3584) // text_heads
    vparams = v.get("rope_parameters") or {}
    return {
        "tower": "qwen2_5_vl", "projector": "qwen2_5_vl",
        "hidden_size": hidden, "intermediate_size": positive(v, "intermediate_size", 3420),
        "num_hidden_layers": depth, "num_attention_heads": heads,
        "image_size": 0, "patch_size": positive(v, "patch_size", 14), "layer_norm_eps": 1e-6,
        "hidden_act": "silu", "num_channels": positive(v, "in_channels", 3),
        "tokens_per_image": 0,  # as many as the image's size gives
        "image_token_id": positive(config, "image_token_id", 151655),
        "image_marker": "<|vision_start|><|image_pad|><|vision_end|>",
        "image_sequence": "<|vision_start|>{image}<|vision_end|>", "image_token": "<|image_pad|>",
        "scale_factor": positive(v, "spatial_merge_size", 2), "temporal_patch_size": positive(v, "temporal_patch_size", 2),
        "window_size": positive(v, "window_size", 112), "full_attention_layers": full,
        "rope_theta": float(vparams.get("rope_theta", 10000.0)) if isinstance(vparams, dict) else 10000.0,
        "mrope_section": _mrope_section(config, int(head_dim)),
    }


def _biased(_: Any) -> dict[str, Any]:
    return {"attention_bias": True}


def _gguf_fields(m: Any) -> dict[str, Any]:
    """llama.cpp's `qwen2vl` text GGUF: biased q/k/v and rope.dimension_sections, the M-RoPE
    sections (t, h, w, and a fourth that Qwen2.5-VL leaves 0), which the mmproj's tower needs."""
    sections = m.raw("rope.dimension_sections")
    ok = isinstance(sections, list) and len(sections) == 4 and all(isinstance(s, int) and s >= 0 for s in sections)
    if not ok or sections[3] != 0 or min(sections[:3]) <= 0:
        raise ModelFormatError(f"GGUF {m.arch}.rope.dimension_sections must be three positive integers and a 0, "
                               f"got {sections!r}")
    pairs = m.pos_int("rope.dimension_count", m.pos_int("embedding_length") // m.pos_int("attention.head_count")) // 2
    if sum(sections) != pairs:
        raise ModelFormatError(f"GGUF {m.arch}.rope.dimension_sections {sections} do not cover the head's {pairs} "
                               "rotary pairs")
    return {"attention_bias": True, "extra": {"gguf_architecture": m.arch, "mrope_section": tuple(sections[:3])}}


MODEL = Qwen2_5_VLForConditionalGeneration
ARCH = Architecture("qwen2_5_vl", ("qwen2_5_vl",), ("qwen2vl",), hf_config=_hf_config, hf_fields=_biased,
                    hf_vision=_hf_vision, hf_sliding=_hf_sliding, hf_max_positions=128000, gguf_fields=_gguf_fields)
