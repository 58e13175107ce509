"""Gemma 3 (text): sliding and global layers, q/k norms, scaled embeddings, four norms a block."""
from __future__ import annotations

import torch
from torch import nn

from mlxr.config import ModelArgs
from mlxr.layers.attention import AttnMetadata, PagedAttention
from mlxr.layers.mlp import GatedMLP
from mlxr.layers.norm import GemmaRMSNorm
from mlxr.layers.rope import RotaryEmbedding
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


MODEL = Gemma3ForCausalLM
ARCH = Architecture(
    "gemma3", ("gemma3", "gemma3_text"), ("gemma3",),
    gguf_tensors={
        "ffn_norm": "pre_feedforward_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
    },
    layer_shapes=_layer_shapes,
    gguf_norm_plus_one=True,
)
