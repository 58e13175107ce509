"""Gemma 3 (text): sliding and global layers, q/k norms, scaled embeddings, four norms a block."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlxr.errors import ModelFormatError
from mlxr.formats.hf_config import activation, boolean, optional_float, positive, sliding_from_config
from mlxr.layers.attention import AttnMetadata, PagedAttention
from mlxr.layers.mlp import GatedMLP
from mlxr.layers.norm import GemmaRMSNorm
from mlxr.layers.rope import RotaryEmbedding
from mlxr.model_config import ModelArgs
from mlxr.models.arch import Architecture
from mlxr.models.llama import KVCache, LlamaAttention, LlamaBackbone, LlamaForCausalLM, input_norm


class Gemma3Attention(LlamaAttention):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__(args, layer)
        sliding = args.is_sliding(layer)
        theta = args.rope_local_base_freq if sliding else args.rope_theta
        # Sliding layers use plain RoPE; only global layers take the configured scaling.
        self.rotary = RotaryEmbedding(
            self.head_dim, theta or args.rope_theta, None if sliding else args.rope_scaling
        )
        scalar = args.query_pre_attn_scalar or self.head_dim
        self.attn = PagedAttention(
            self.n_heads,
            self.n_kv,
            self.head_dim,
            scalar**-0.5,
            args.sliding_window if sliding else None,
            args.attn_logit_softcapping,
        )
        self.q_norm = GemmaRMSNorm(self.head_dim, args.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, args.rms_norm_eps)


class Gemma3Block(nn.Module):
    attention_class: type[nn.Module] = Gemma3Attention

    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        dim, eps = args.hidden_size, args.rms_norm_eps
        self.self_attn = self.attention_class(args, layer)
        self.mlp = GatedMLP(dim, args.intermediate_size, args.hidden_act)
        self.input_layernorm = GemmaRMSNorm(dim, eps)
        self.post_attention_layernorm = GemmaRMSNorm(dim, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(dim, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(dim, eps)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, meta: AttnMetadata,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As LlamaBlock: returns (post-normed MLP output, residual) for a fused add-and-norm."""
        normed, residual = input_norm(self.input_layernorm, x, residual)
        attn = self.self_attn(normed, positions, kv_cache, meta)
        normed, residual = self.pre_feedforward_layernorm(self.post_attention_layernorm(attn), residual)
        return self.post_feedforward_layernorm(self.mlp(normed)), residual


class Gemma3Backbone(LlamaBackbone):
    block_class = Gemma3Block

    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args)
        self.norm = GemmaRMSNorm(args.hidden_size, args.rms_norm_eps)
        self.embed_scale = args.hidden_size**0.5

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids).to(self.norm.weight.dtype)
        # The scale is rounded to the activation dtype first, as the checkpoints were trained.
        return h * torch.tensor(self.embed_scale, dtype=h.dtype)


class Gemma3ForCausalLM(LlamaForCausalLM):
    backbone_class = Gemma3Backbone


def _layer_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    h, d = args.hidden_size, args.head_dim
    return {"pre_feedforward_layernorm.weight": (h,), "post_feedforward_layernorm.weight": (h,),
            "self_attn.q_norm.weight": (d,), "self_attn.k_norm.weight": (d,)}


# Keys a multimodal Gemma 3 text_config usually omits: Gemma3TextConfig's defaults.
_HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "query_pre_attn_scalar": 256, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "sliding_window": 4096,
    "bos_token_id": 2, "eos_token_id": 1,
}
_SWA_PATTERN = 6  # every 6th layer is global where neither format says otherwise
_27B_LAYERS = 62  # llama.cpp scales its attention by hidden / heads (GGUF stores no scalar)


def _hf_config(config: dict) -> dict:
    """The text model's keys (a multimodal config nests them in text_config), defaults filled."""
    cfg = _text_config(config) if config.get("model_type") == "gemma3" else dict(config)
    return {**_HF_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}


def _text_config(config: dict) -> dict:
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ModelFormatError("config.json of model_type 'gemma3' lacks a text_config object")
    merged = dict(text)
    # Token ids and tying live at the top level of the multimodal config.
    for key in ("bos_token_id", "eos_token_id", "tie_word_embeddings"):
        if key not in merged and key in config:
            merged[key] = config[key]
    return merged


def _hf_fields(cfg: dict) -> dict[str, Any]:
    return {"tie_word_embeddings": boolean(cfg, "tie_word_embeddings", True),
            "hidden_act": activation(cfg, "gelu_pytorch_tanh"),
            "query_pre_attn_scalar": optional_float(cfg, "query_pre_attn_scalar")}


def _hf_pattern(cfg: dict, layers: int) -> tuple[bool, ...]:
    pattern = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", _SWA_PATTERN))
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern <= 0:
        raise ModelFormatError(f"sliding_window_pattern must be a positive integer, got {pattern!r}")
    return tuple((i + 1) % pattern != 0 for i in range(layers))


def _hf_sliding(cfg: dict, layers: int) -> tuple[int | None, tuple[bool, ...]]:
    return sliding_from_config(cfg, layers, pattern=_hf_pattern)


def _gguf_fields(m: Any) -> dict[str, Any]:
    """What llama.cpp fills for Gemma 3 where the file is silent: every 6th layer global, RMSNorm
    eps 1e-6, and an attention scale of head_dim ** -0.5 (n_embd / n_head for the 62-layer 27B)."""
    layers, hidden, heads = m.pos_int("block_count"), m.pos_int("embedding_length"), m.pos_int("attention.head_count")
    head_dim = m.pos_int("attention.key_length", m.pos_int("rope.dimension_count", hidden // heads))
    window, sliding = _gguf_sliding(m, layers)
    return {
        "rms_norm_eps": m.pos_float("attention.layer_norm_rms_epsilon", 1e-6),
        "hidden_act": "gelu_pytorch_tanh",
        "sliding_window": window,
        "sliding_layers": sliding,
        "query_pre_attn_scalar": float(hidden // heads if layers == _27B_LAYERS else head_dim),
    }


def _gguf_sliding(m: Any, layers: int) -> tuple[int, tuple[bool, ...]]:
    window = m.pos_int("attention.sliding_window")
    pattern = m.raw("attention.sliding_window_pattern")
    if isinstance(pattern, list):
        if len(pattern) != layers or not all(isinstance(p, bool) for p in pattern):
            raise ModelFormatError(f"GGUF {m.arch}.attention.sliding_window_pattern must be {layers} booleans")
        return window, tuple(pattern)
    n = pattern if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0 else _SWA_PATTERN
    return window, tuple((i + 1) % n != 0 for i in range(layers))


def _hf_vision(config: dict) -> dict[str, Any]:
    """The SigLIP tower of config.json's vision_config and Gemma 3's image tokens (the
    processor's full_image_sequence: two newlines, boi, the soft tokens, eoi, two newlines)."""
    v = config["vision_config"]
    return {
        "tower": "siglip", "projector": "gemma3",
        "hidden_size": positive(v, "hidden_size", 1152), "intermediate_size": positive(v, "intermediate_size", 4304),
        "num_hidden_layers": positive(v, "num_hidden_layers", 27),
        "num_attention_heads": positive(v, "num_attention_heads", 16),
        "image_size": positive(v, "image_size", 896), "patch_size": positive(v, "patch_size", 14),
        "layer_norm_eps": float(v.get("layer_norm_eps") or 1e-6),
        "hidden_act": activation(v, "gelu_pytorch_tanh"),
        "num_channels": positive(v, "num_channels", 3),
        "tokens_per_image": positive(config, "mm_tokens_per_image", 256),
        "image_token_id": positive(config, "image_token_index", 262144),
        "image_marker": "<start_of_image>",
        "image_sequence": "\n\n<start_of_image>{image}<end_of_image>\n\n",
        "image_token": "<image_soft_token>",
        "bidirectional": True,
    }


MODEL = Gemma3ForCausalLM
ARCH = Architecture(
    "gemma3", ("gemma3", "gemma3_text"), ("gemma3",),
    hf_config=_hf_config,
    hf_fields=_hf_fields,
    hf_sliding=_hf_sliding,
    default_rope_theta=1_000_000.0,
    local_rope_theta=10000.0,
    hf_max_positions=131072,
    gguf_fields=_gguf_fields,
    gguf_tensors={
        "ffn_norm": "pre_feedforward_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
    },
    layer_shapes=_layer_shapes,
    gguf_norm_plus_one=True,
    hf_vision=_hf_vision,
)
