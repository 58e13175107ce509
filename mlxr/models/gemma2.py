"""Gemma 2: Gemma 3's block (four norms, scaled embeddings) without q/k norms, sliding windows on
alternating layers, one RoPE theta, and tanh soft-capping of attention scores and final logits."""
from __future__ import annotations

from typing import Any

from torch import nn

from mlxr.formats.hf_config import boolean, positive_float
from mlxr.model_config import ModelArgs
from mlxr.models.arch import Architecture
from mlxr.models.gemma3 import Gemma3Attention, Gemma3Backbone, Gemma3Block, Gemma3ForCausalLM

_27B_LAYERS = 46  # llama.cpp scales its attention by hidden / heads (GGUF stores no scalar)


class Gemma2Attention(Gemma3Attention):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__(args, layer)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()


class Gemma2Block(Gemma3Block):
    attention_class = Gemma2Attention


class Gemma2Backbone(Gemma3Backbone):
    block_class = Gemma2Block


class Gemma2ForCausalLM(Gemma3ForCausalLM):
    backbone_class = Gemma2Backbone


def _alternating(layers: int) -> tuple[bool, ...]:
    return tuple(i % 2 == 0 for i in range(layers))  # even layers slide, odd ones are global


def _hf_fields(cfg: dict) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "query_pre_attn_scalar": positive_float(cfg, "query_pre_attn_scalar", 256),
        "tie_word_embeddings": boolean(cfg, "tie_word_embeddings", True),
    }
    if cfg.get("sliding_window") is not None and cfg.get("layer_types") is None:
        fields["sliding_layers"] = _alternating(cfg["num_hidden_layers"])
    return fields


def _gguf_fields(m: Any) -> dict[str, Any]:
    layers, hidden, heads = m.pos_int("block_count"), m.pos_int("embedding_length"), m.pos_int("attention.head_count")
    head_dim = m.pos_int("attention.key_length", hidden // heads)
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "sliding_window": m.pos_int("attention.sliding_window"),
        "sliding_layers": _alternating(layers),
        "query_pre_attn_scalar": float(hidden // heads if layers == _27B_LAYERS else head_dim),
    }


def _layer_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    h = args.hidden_size
    return {"pre_feedforward_layernorm.weight": (h,), "post_feedforward_layernorm.weight": (h,)}


MODEL = Gemma2ForCausalLM
ARCH = Architecture(
    "gemma2", ("gemma2",), ("gemma2",),
    hf_fields=_hf_fields,
    gguf_fields=_gguf_fields,
    gguf_tensors={"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                  "post_ffw_norm": "post_feedforward_layernorm"},
    layer_shapes=_layer_shapes,
    gguf_norm_plus_one=True,
)
