"""Tiny random vision-language models written by HF transformers itself (its real model class,
save_pretrained, and its PIL image processor's preprocessor_config.json), with the fixture
tokenizer's files beside them. Needs transformers and Pillow (test dependencies)."""
from __future__ import annotations

import json
from pathlib import Path

from mlxr.testing import fixture_tokenizer as ft
from mlxr.testing.arch_fixtures import random_value
from mlxr.testing.write_once import write_once

VLM_FIXTURE_VERSION = 2
_SPEC = ft.GEMMA_VLM
_BOI, _EOI, _IMAGE = (_SPEC.specials.index(t) for t in ("<start_of_image>", "<end_of_image>", "<image_soft_token>"))

# Text: 2 layers (sliding window 8, then global), so an image's 16 tokens overrun the window and
# the bidirectional span must be cut by it. Vision: 32 x 32 pixels in 4 x 4 patches (an 8 x 8
# grid) average-pooled 2 x 2 into 16 soft tokens.
GEMMA3_VLM = {
    "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {
        "model_type": "gemma3_text", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
        "query_pre_attn_scalar": 32, "rms_norm_eps": 1e-6, "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 512,
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": False, "pad_token_id": 0,
        "bos_token_id": 2, "eos_token_id": [1, 5],
    },
    "vision_config": {
        "model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "image_size": 32, "patch_size": 4, "layer_norm_eps": 1e-6,
        "vision_use_head": False,
    },
    "mm_tokens_per_image": 16, "boi_token_index": _BOI, "eoi_token_index": _EOI, "image_token_index": _IMAGE,
    "bos_token_id": 2, "eos_token_id": [1, 5], "pad_token_id": 0, "tie_word_embeddings": False,
}
# LLaVA: a 2-layer Llama, a 3-layer CLIP tower read after its second layer (feature layer -2),
# 32 x 32 pixels in 8 x 8 patches: 16 image tokens.
LLAVA = {
    "model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
    "text_config": {
        "model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 256, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2,
    },
    "vision_config": {
        "model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 2, "image_size": 32, "patch_size": 8, "layer_norm_eps": 1e-5,
        "hidden_act": "quick_gelu", "projection_dim": 32,
    },
    "image_token_index": ft.LLAVA.specials.index("<image>"), "image_seq_length": 16,
    "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "projector_hidden_act": "gelu",
    "tie_word_embeddings": False,
}
# Idefics3: a 2-layer Llama, a 2-layer tower of 64 x 64 tiles in 8 x 8 patches (an 8 x 8 grid)
# pixel-shuffled 2 x 2 into 16 tokens a tile; the processor resizes the longest edge to 128, so an
# image is up to 2 x 2 tiles and the whole one. SmolVLM: the same with its own classes and
# 4 x 4 shuffling (4 tokens a tile), tied embeddings.
IDEFICS3 = {
    "model_type": "idefics3", "architectures": ["Idefics3ForConditionalGeneration"],
    "text_config": {**LLAVA["text_config"], "architectures": ["VLlama3ForCausalLM"]},
    "vision_config": {
        "model_type": "idefics3_vision", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "image_size": 64, "patch_size": 8, "layer_norm_eps": 1e-6,
    },
    "image_token_id": ft.IDEFICS3.specials.index("<image>"), "scale_factor": 2, "tie_word_embeddings": False,
}
SMOLVLM = {
    **IDEFICS3, "model_type": "smolvlm", "architectures": ["SmolVLMForConditionalGeneration"],
    "text_config": {**IDEFICS3["text_config"], "tie_word_embeddings": True},
    "vision_config": {**IDEFICS3["vision_config"], "model_type": "smolvlm_vision"},
    "scale_factor": 4, "tie_word_embeddings": True,
}
IDEFICS3_LONGEST_EDGE = 128
# Qwen2.5-VL: a 2-layer Qwen2 with M-RoPE (head 16: 8 pairs as 2 temporal, 3 height, 3 width), a
# 3-layer tower of 4-pixel patches merged 2 x 2 (a token per 8 x 8 pixels), windows of 16 pixels
# (2 x 2 tokens) but in layer 1; the processor keeps 64..1024 pixels x 4 (up to 64 tokens).
QWEN25_VL = {
    "model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "text_config": {
        "model_type": "qwen2_5_vl_text", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 2,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    },
    "vision_config": {
        "depth": 3, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 16,
        "out_hidden_size": 64, "fullatt_block_indexes": [1], "image_size": 32,
    },
    "image_token_id": ft.QWEN2_VL.specials.index("<|image_pad|>"),
    "vision_start_token_id": ft.QWEN2_VL.specials.index("<|vision_start|>"),
    "vision_end_token_id": ft.QWEN2_VL.specials.index("<|vision_end|>"),
    "video_token_id": 511, "tie_word_embeddings": False,
}
QWEN25_VL_PIXELS = (8 * 8 * 4, 8 * 8 * 64)
# For bench/vision_prefix_cache.py: Gemma 3 270M's text width, a SigLIP of 224 pixels in 14-pixel
# patches (16 x 16) pooled to 64 soft tokens.
GEMMA3_VLM_SHAPE = {
    **GEMMA3_VLM,
    "text_config": {**GEMMA3_VLM["text_config"], "hidden_size": 640, "intermediate_size": 2048,
                    "num_hidden_layers": 6, "num_attention_heads": 4, "head_dim": 256,
                    "query_pre_attn_scalar": 256, "sliding_window": 512, "max_position_embeddings": 2048,
                    "layer_types": ["sliding_attention"] * 5 + ["full_attention"]},
    "vision_config": {**GEMMA3_VLM["vision_config"], "hidden_size": 384, "intermediate_size": 1536,
                      "num_hidden_layers": 6, "num_attention_heads": 6, "image_size": 224, "patch_size": 14},
    "mm_tokens_per_image": 64,
}
# The GGUF + mmproj tests' Gemma 3: a GGUF keeps no layer pattern, and llama.cpp makes every sixth
# layer global, so of two layers none: the HF checkpoint says the same.
GEMMA3_VLM_SWA = {**GEMMA3_VLM, "text_config": {**GEMMA3_VLM["text_config"], "layer_types": ["sliding_attention"] * 2}}
VLM_FIXTURES = {"tiny-gemma3-vlm": (GEMMA3_VLM, 21), "tiny-llava": (LLAVA, 22), "gemma3-vlm-shape": (GEMMA3_VLM_SHAPE, 23),
                "tiny-gemma3-vlm-swa": (GEMMA3_VLM_SWA, 24), "tiny-idefics3": (IDEFICS3, 25),
                "tiny-smolvlm": (SMOLVLM, 26), "tiny-qwen25-vl": (QWEN25_VL, 27)}
_KINDS = {"tiny-gemma3-vlm": ("Gemma3ForConditionalGeneration", _SPEC),
          "tiny-gemma3-vlm-swa": ("Gemma3ForConditionalGeneration", _SPEC),
          "gemma3-vlm-shape": ("Gemma3ForConditionalGeneration", _SPEC),
          "tiny-llava": ("LlavaForConditionalGeneration", ft.LLAVA),
          "tiny-idefics3": ("Idefics3ForConditionalGeneration", ft.IDEFICS3),
          "tiny-smolvlm": ("SmolVLMForConditionalGeneration", ft.IDEFICS3),
          "tiny-qwen25-vl": ("Qwen2_5_VLForConditionalGeneration", ft.QWEN2_VL)}


def _value(seed: int, name: str, shape: tuple[int, ...], gemma: bool):
    # The tower's LayerNorms scale by w (near 1); Gemma's RMS norms, the projector's too, by 1 + w.
    return random_value(seed, name, shape, gemma_norms=gemma and "vision_tower" not in name)


def _processor(name: str, side: int):
    if name == "tiny-qwen25-vl":
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        least, most = QWEN25_VL_PIXELS
        return Qwen2VLImageProcessorPil(size={"shortest_edge": least, "longest_edge": most}, patch_size=4,
                                        merge_size=2, temporal_patch_size=2)
    if name in ("tiny-idefics3", "tiny-smolvlm"):
        from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
        from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

        cls = Idefics3ImageProcessorPil if name == "tiny-idefics3" else SmolVLMImageProcessorPil
        return cls(size={"longest_edge": IDEFICS3_LONGEST_EDGE}, max_image_size={"longest_edge": side})
    if name == "tiny-llava":
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

        return CLIPImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    return Gemma3ImageProcessorPil(size={"height": side, "width": side})


def write_hf(name: str, out_dir: Path) -> Path:
    import torch
    import transformers
    from transformers import AutoConfig

    config_dict, seed = VLM_FIXTURES[name]
    class_name, spec = _KINDS[name]
    cfg = json.loads(json.dumps(config_dict))
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = getattr(transformers, class_name)(config).to(torch.float32)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            param.copy_(torch.from_numpy(_value(seed, pname, tuple(param.shape), spec is _SPEC)))
    hf_dir = Path(out_dir) / "hf"
    model.save_pretrained(hf_dir)
    _processor(name, config_dict["vision_config"]["image_size"]).save_pretrained(hf_dir)
    text_cfg = config_dict["text_config"]
    tok = ft.build_tokenizer(spec, text_cfg["vocab_size"])
    for fname, text in ft.hf_tokenizer_files(tok, spec, text_cfg["max_position_embeddings"]).items():
        (hf_dir / fname).write_text(text, encoding="utf-8")
    gen = {"bos_token_id": text_cfg["bos_token_id"], "eos_token_id": text_cfg["eos_token_id"]}
    (hf_dir / "generation_config.json").write_text(json.dumps(gen))
    return hf_dir


def vlm_fixture_dir(name: str, root: Path) -> Path:
    """Write the fixture's HF directory once under root and reuse it."""
    final = Path(root) / f"{name}-v{VLM_FIXTURE_VERSION}"
    return write_once(final, lambda tmp: write_hf(name, tmp), name) / "hf"
