"""Qwen3 (dense): the Llama anatomy with an RMSNorm on each head of q and k before RoPE."""
from __future__ import annotations

from mlxr.layers.norm import RMSNorm
from mlxr.model_config import ModelArgs
from mlxr.models.arch import Architecture
from mlxr.models.llama import LlamaAttention, LlamaBackbone, LlamaBlock, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__(args, layer)
        self.q_norm = RMSNorm(self.head_dim, args.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, args.rms_norm_eps)


class Qwen3Block(LlamaBlock):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__(args, layer)
        self.self_attn = Qwen3Attention(args, layer)


class Qwen3Backbone(LlamaBackbone):
    block_class = Qwen3Block


class Qwen3ForCausalLM(LlamaForCausalLM):
    backbone_class = Qwen3Backbone


def head_norm_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    return {"self_attn.q_norm.weight": (args.head_dim,), "self_attn.k_norm.weight": (args.head_dim,)}


HEAD_NORM_TENSORS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
MODEL = Qwen3ForCausalLM
ARCH = Architecture("qwen3", ("qwen3",), ("qwen3",), gguf_tensors=HEAD_NORM_TENSORS,
                    layer_shapes=head_norm_shapes)
