"""What llama.cpp's converter writes for Qwen3.5 (GGUF `qwen35` / `qwen35moe`), and how to undo it.

Besides names, the converter changes: A_log is stored as A = -exp(A_log); the conv1d weight
loses its middle axis; every RMSNorm weight but DeltaNet's gated one is stored as 1 + w; and,
where there are more value heads than key heads, the value heads of DeltaNet's tensors are
reordered from grouped by key head (HF: k0's v0..v{r-1}, then k1's) to tiled (v0 of every key
head, then v1 of every key head), in the value rows of in_proj_qkv and the conv, the rows of
in_proj_z / in_proj_a / in_proj_b, A and dt, and the columns of out_proj."""
from __future__ import annotations

from typing import Any

import numpy as np

from mlxr.errors import ModelFormatError
from mlxr.formats.gguf_config import main_layer_count
from mlxr.model_config import LinearAttentionArgs, ModelArgs
from mlxr.models import moe_arch
from mlxr.models.qwen3 import HEAD_NORM_TENSORS

TENSORS = {
    **HEAD_NORM_TENSORS,
    "post_attention_norm": "post_attention_layernorm",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
    "ssm_a": "linear_attn.A_log",
    "ssm_dt.bias": "linear_attn.dt_bias",
}
MOE_TENSORS = {**TENSORS, **moe_arch.GGUF_TENSORS, "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
               "ffn_up_shexp": "mlp.shared_expert.up_proj", "ffn_down_shexp": "mlp.shared_expert.down_proj",
               "ffn_gate_inp_shexp": "mlp.shared_expert_gate"}


def stored_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A parameter's shape as the converter stores it (the conv weight without its middle axis)."""
    return (shape[0], shape[2]) if name.endswith("conv1d.weight") else shape


def gguf_fields(m: Any) -> dict[str, Any]:
    value_heads = m.pos_int("ssm.time_step_rank")
    inner = m.pos_int("ssm.inner_size")
    if inner % value_heads:
        raise ModelFormatError(f"GGUF {m.arch}.ssm.inner_size {inner} is not a multiple of time_step_rank {value_heads}")
    layers = main_layer_count(m)
    linear = LinearAttentionArgs(
        layers=_recurrent_layers(m, layers),
        num_key_heads=m.pos_int("ssm.group_count"),
        num_value_heads=value_heads,
        key_head_dim=m.pos_int("ssm.state_size"),
        value_head_dim=inner // value_heads,
        conv_kernel=m.pos_int("ssm.conv_kernel"),
    )
    if value_heads % linear.num_key_heads:
        raise ModelFormatError(f"GGUF {m.arch}.ssm.time_step_rank must be a multiple of ssm.group_count")
    head_dim = m.pos_int("attention.key_length", m.pos_int("embedding_length") // m.pos_int("attention.head_count"))
    rotary = m.pos_int("rope.dimension_count", head_dim)
    if rotary > head_dim or rotary % 2:
        raise ModelFormatError(f"GGUF {m.arch}.rope.dimension_count {rotary} must be even and at most {head_dim}")
    return {"linear_attention": linear, "partial_rotary_factor": rotary / head_dim}


def moe_gguf_fields(m: Any) -> dict[str, Any]:
    return {**gguf_fields(m), **moe_arch.gguf_counts(m), "norm_topk_prob": True,
            "moe_intermediate_size": m.pos_int("expert_feed_forward_length"),
            "intermediate_size": m.pos_int("expert_shared_feed_forward_length")}


def _recurrent_layers(m: Any, layers: int) -> tuple[bool, ...]:
    flags = m.raw("attention.recurrent_layers")
    if flags is None:
        interval = m.pos_int("full_attention_interval", 4)
        return tuple((i + 1) % interval != 0 for i in range(layers))
    # The converter lists the MTP layers (full attention) after the model's own.
    total = m.pos_int("block_count")
    if not isinstance(flags, list) or len(flags) != total or not all(isinstance(f, bool) for f in flags):
        raise ModelFormatError(f"GGUF {m.arch}.attention.recurrent_layers must list {total} booleans")
    return tuple(flags[:layers])


def _untile(array: np.ndarray, axis: int, key_heads: int, group: int, head_dim: int) -> np.ndarray:
    """Value heads from the converter's tiled order back to grouped by key head, along axis."""
    shape = array.shape
    split = shape[:axis] + (group, key_heads, head_dim) + shape[axis + 1:]
    return np.ascontiguousarray(np.swapaxes(array.reshape(split), axis, axis + 1).reshape(shape))


def to_hf_layout(target: str, array: np.ndarray, args: ModelArgs) -> np.ndarray:
    if target.endswith("norm.weight") and not target.endswith("linear_attn.norm.weight"):
        return array - np.float32(1.0)
    if ".linear_attn." not in target:
        return array
    la = args.linear_attention
    hk, dv, group = la.num_key_heads, la.value_head_dim, la.num_value_heads // la.num_key_heads
    qk = 2 * hk * la.key_head_dim
    if target.endswith(".A_log"):
        array = np.log(-array.astype(np.float64)).astype(np.float32)
    if target.endswith(".conv1d.weight"):
        array = array.reshape(array.shape[0], 1, array.shape[-1])
    if group == 1:
        return array
    if target.endswith((".in_proj_qkv.weight", ".conv1d.weight")):
        return np.concatenate([array[:qk], _untile(array[qk:], 0, hk, group, dv)])
    if target.endswith(".in_proj_z.weight"):
        return _untile(array, 0, hk, group, dv)
    if target.endswith((".in_proj_a.weight", ".in_proj_b.weight", ".A_log", ".dt_bias")):
        return _untile(array, 0, hk, group, 1)
    if target.endswith(".out_proj.weight"):
        return _untile(array, 1, hk, group, dv)
    return array
