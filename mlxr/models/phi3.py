"""Phi-3: the Llama anatomy with q/k/v in one checkpoint tensor (qkv_proj) and gate/up in one
(gate_up_proj, gate rows first), and LongRoPE (RopeScaling "longrope", layers/rope.py)."""
from __future__ import annotations

import math
from typing import Any

from mlxr.errors import ModelFormatError
from mlxr.model_config import ModelArgs, RopeScaling
from mlxr.models.arch import Architecture
from mlxr.models.llama import LlamaForCausalLM

_QKV, _GATE_UP = "self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"


def _fused(args: ModelArgs) -> dict[str, tuple[tuple[str, int], ...]]:
    q, kv, inter = args.num_attention_heads * args.head_dim, args.num_key_value_heads * args.head_dim, args.intermediate_size
    return {
        _QKV: (("self_attn.q_proj.weight", q), ("self_attn.k_proj.weight", kv), ("self_attn.v_proj.weight", kv)),
        _GATE_UP: (("mlp.gate_proj.weight", inter), ("mlp.up_proj.weight", inter)),
    }


def _layer_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    h = args.hidden_size
    return {name: (sum(rows for _, rows in parts), h) for name, parts in _fused(args).items()}


def _gguf_fields(m: Any) -> dict[str, Any]:
    """LongRoPE from llama.cpp's rope_factors_long/short tensors and rope.scaling.* keys."""
    long_f, short_f = m.tensor("rope_factors_long.weight"), m.tensor("rope_factors_short.weight")
    if long_f is None and short_f is None:
        return {}
    if long_f is None or short_f is None or long_f.shape != short_f.shape:
        raise ModelFormatError("GGUF phi3 file needs both rope_factors_long and rope_factors_short of one shape")
    orig = m.pos_int("rope.scaling.original_context_length")
    factor = m.pos_int("context_length") / orig
    default_attn = math.sqrt(1 + math.log(factor) / math.log(orig)) if factor > 1.0 else 1.0
    scaling = RopeScaling("longrope", factor, original_max_position_embeddings=orig,
                          long_factor=tuple(float(v) for v in long_f.reshape(-1)),
                          short_factor=tuple(float(v) for v in short_f.reshape(-1)),
                          attention_factor=m.pos_float("rope.scaling.attn_factor", default_attn))
    return {"rope_scaling": scaling}


MODEL = LlamaForCausalLM
ARCH = Architecture(
    "phi3", ("phi3",), ("phi3",),
    gguf_fields=_gguf_fields,
    gguf_tensors={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    layer_shapes=_layer_shapes,
    absent_layer_params=("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                         "mlp.gate_proj.weight", "mlp.up_proj.weight"),
    fused_tensors=_fused,
)
