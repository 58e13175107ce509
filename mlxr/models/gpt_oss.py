"""gpt-oss: Llama's anatomy with biased q/k/v/o projections, one learned attention sink per head
(a logit every softmax counts, whose weight is dropped), layers alternating a sliding window
(128 tokens in the released models) and full attention, YaRN RoPE, and a mixture of experts on
every layer (models/gpt_oss_moe.py) whose experts stay MXFP4 where the checkpoint has them so
(models/gpt_oss_checkpoint.py for the safetensors layout; GGUF's MXFP4 type)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlxr.errors import UnsupportedModelError
from mlxr.formats.hf_config import boolean, positive_float, positive_int, sliding_from_config
from mlxr.layers.attention import AttnMetadata
from mlxr.layers.linear import Linear
from mlxr.model_config import ModelArgs
from mlxr.models import moe_arch
from mlxr.models.arch import Architecture
from mlxr.models.gpt_oss_checkpoint import checkpoint_tensors
from mlxr.models.gpt_oss_moe import SWIGLU_ALPHA, SWIGLU_LIMIT, GptOssMoE
from mlxr.models.llama import KVCache, LlamaAttention, LlamaBackbone, LlamaBlock, LlamaForCausalLM


class SinkLogits(nn.Module):
    """One attention-sink logit per query head (a module so the parameter is `.weight`)."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(heads), requires_grad=False)


class GptOssAttention(LlamaAttention):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__(args, layer)
        self.o_proj = Linear(self.n_heads * self.head_dim, args.hidden_size, bias=args.attention_bias)
        self.sinks = SinkLogits(self.n_heads)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache, meta: AttnMetadata) -> torch.Tensor:
        t, sinks = x.shape[0], self.sinks.weight
        q = self._fused_decode_qkv(x, positions, kv_cache, meta)
        if q is not None:
            out = self.attn.attend(q, kv_cache, meta, sinks)
        else:
            q, k, v = self.normed_qkv(x)
            out = self.attn(q, k, v, kv_cache, meta, positions, self.rotary.frequencies(positions), sinks)
        return self.o_proj(out.reshape(t, -1))


class GptOssBlock(LlamaBlock):
    def __init__(self, args: ModelArgs, layer: int) -> None:
        super().__init__(args, layer)
        self.self_attn = GptOssAttention(args, layer)
        self.mlp = GptOssMoE(args.hidden_size, moe_arch.expert_intermediate(args), args.num_experts,
                             args.num_experts_per_tok, alpha=args.extra.get("swiglu_alpha", SWIGLU_ALPHA),
                             limit=args.extra.get("swiglu_limit", SWIGLU_LIMIT))


class GptOssBackbone(LlamaBackbone):
    block_class = GptOssBlock


class GptOssForCausalLM(LlamaForCausalLM):
    backbone_class = GptOssBackbone


def _alternating(layers: int) -> tuple[bool, ...]:
    """gpt-oss's default layer types: sliding on even layers, full on odd ones."""
    return tuple(i % 2 == 0 for i in range(layers))


def _hf_sliding(cfg: dict, layers: int) -> tuple[int | None, tuple[bool, ...]]:
    return sliding_from_config({"sliding_window": 128, **cfg}, layers, pattern=lambda _, n: _alternating(n))


def _hf_fields(cfg: dict) -> dict[str, Any]:
    if cfg.get("rope_parameters") is None and cfg.get("rope_scaling") is None:
        raise UnsupportedModelError("gpt_oss config.json without rope_parameters (its YaRN) is not supported")
    return {"num_experts": positive_int(cfg, "num_local_experts"),
            "num_experts_per_tok": positive_int(cfg, "num_experts_per_tok"),
            "moe_intermediate_size": positive_int(cfg, "intermediate_size"),
            "attention_bias": boolean(cfg, "attention_bias", True),
            "extra": {"hf_model_type": "gpt_oss", "swiglu_alpha": positive_float(cfg, "swiglu_alpha", SWIGLU_ALPHA),
                      "swiglu_limit": positive_float(cfg, "swiglu_limit", SWIGLU_LIMIT)}}


def _gguf_fields(m: Any) -> dict[str, Any]:
    """llama.cpp's gpt-oss: alternating layers, biases, the SwiGLU constants fixed at the released
    ones; its YaRN truncates the correction range (ggml's rule: GGUF stores no flag), where
    transformers' gpt-oss config does not (arch_variants.py's gguf-gpt_oss-untruncated-yarn)."""
    layers = m.pos_int("block_count")
    fields: dict[str, Any] = {
        **moe_arch.gguf_counts(m), "moe_intermediate_size": m.pos_int("expert_feed_forward_length"),
        "attention_bias": True, "sliding_window": m.pos_int("attention.sliding_window", 128),
        "sliding_layers": _alternating(layers), "extra": {"gguf_architecture": m.arch},
    }
    return fields


def _layer_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    e, h, i = args.num_experts, args.hidden_size, moe_arch.expert_intermediate(args)
    return {"self_attn.o_proj.bias": (h,), "self_attn.sinks.weight": (args.num_attention_heads,),
            "mlp.router.weight": (e, h), "mlp.router.bias": (e,),
            "mlp.experts.gate_proj.weight": (e, i, h), "mlp.experts.up_proj.weight": (e, i, h),
            "mlp.experts.down_proj.weight": (e, h, i), "mlp.experts.gate_proj.bias": (e, i),
            "mlp.experts.up_proj.bias": (e, i), "mlp.experts.down_proj.bias": (e, h)}


MODEL = GptOssForCausalLM
ARCH = Architecture(
    "gpt_oss", ("gpt_oss",), ("gpt-oss",),
    hf_fields=_hf_fields,
    hf_sliding=_hf_sliding,
    default_rope_theta=150000.0,
    hf_max_positions=131072,
    gguf_fields=_gguf_fields,
    gguf_tensors={"attn_sinks": "self_attn.sinks", "post_attention_norm": "post_attention_layernorm",
                  "ffn_gate_inp": "mlp.router", "ffn_gate_exps": "mlp.experts.gate_proj",
                  "ffn_up_exps": "mlp.experts.up_proj", "ffn_down_exps": "mlp.experts.down_proj"},
    layer_shapes=_layer_shapes,
    absent_layer_params=moe_arch.DENSE_MLP,
    checkpoint_tensors=checkpoint_tensors,
)
