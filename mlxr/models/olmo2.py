"""OLMo 2: RMSNorms after attention and after the MLP instead of before them (no input norm), and
q/k RMSNorms over the whole projection (all heads together), before RoPE."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlxr.errors import UnsupportedModelError
from mlxr.layers.attention import AttnMetadata
from mlxr.layers.mlp import GatedMLP
from mlxr.layers.norm import RMSNorm
from mlxr.model_config import ModelArgs
from mlxr.models.arch import Architecture
from mlxr.models.llama import KVCache, LlamaAttention, LlamaBackbone, LlamaForCausalLM


class Olmo2Attention(LlamaAttention):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__(args, layer)
        self.q_norm = RMSNorm(self.n_heads * self.head_dim, args.rms_norm_eps)
        self.k_norm = RMSNorm(self.n_kv * self.head_dim, args.rms_norm_eps)

    def normed_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.project_qkv(x)
        t = x.shape[0]
        q = self.q_norm(q.reshape(t, -1)).view(t, self.n_heads, self.head_dim)
        k = self.k_norm(k.reshape(t, -1)).view(t, self.n_kv, self.head_dim)
        return q, k, v


class Olmo2Block(nn.Module):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__()
        self.self_attn = Olmo2Attention(args, layer)
        self.mlp = GatedMLP(args.hidden_size, args.intermediate_size, args.hidden_act)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, meta: AttnMetadata,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(post-normed MLP output, the stream before it), as LlamaBlock's pair: the stream is
        x + residual, which the next block (or the final norm) adds."""
        stream = x if residual is None else x + residual
        stream = stream + self.post_attention_layernorm(self.self_attn(stream, positions, kv_cache, meta))
        return self.post_feedforward_layernorm(self.mlp(stream)), stream


class Olmo2Backbone(LlamaBackbone):
    block_class = Olmo2Block


class Olmo2ForCausalLM(LlamaForCausalLM):
    backbone_class = Olmo2Backbone


def _layer_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    q, kv = args.num_attention_heads * args.head_dim, args.num_key_value_heads * args.head_dim
    return {"post_feedforward_layernorm.weight": (args.hidden_size,),
            "self_attn.q_norm.weight": (q,), "self_attn.k_norm.weight": (kv,)}


def _gguf_fields(m: Any) -> dict[str, Any]:
    if m.raw("attention.sliding_window"):
        raise UnsupportedModelError("OLMo 3 (olmo2 GGUF with sliding windows) is not supported yet")
    return {}


MODEL = Olmo2ForCausalLM
ARCH = Architecture(
    "olmo2", ("olmo2",), ("olmo2",),
    gguf_fields=_gguf_fields,
    gguf_tensors={"post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
                  "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
    layer_shapes=_layer_shapes,
    absent_layer_params=("input_layernorm.weight",),
)
