"""GGUF tensors -> Hugging Face parameter names, layouts and semantics (float32 numpy).

llama.cpp's converter changes two things besides names, and both are undone here:
- llama and its kin: the rows of q_proj/k_proj (weights and biases) are permuted per head from
  HF's rotate-half layout to interleaved pairs (Architecture.gguf_permuted_qk);
- gemma: every RMSNorm weight is stored as 1 + w (HF keeps w and computes x * (1 + w)).
Which tensors each architecture has comes from its declaration (models/arch.py).
"""
from __future__ import annotations

import re
from collections.abc import Collection, Iterator

import numpy as np

from mlxr.errors import ModelFormatError
from mlxr.formats.gguf import GGUFFile
from mlxr.model_config import ModelArgs
from mlxr.models import architecture
from mlxr.ops.quant.block_types import KEPT_TYPES

# GGUF tensors that carry no HF parameter (their content lives in ModelArgs).
_SKIPPED = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight",
            "cls.output.weight"}  # a decoder reranker's answer rows: loader/rank_head.py
_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_COMMON = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.([a-z][a-z0-9_]*)(?:\.(weight|bias))?")


def hf_name(gguf_name: str, args: ModelArgs) -> str | None:
    """The HF parameter name of a GGUF tensor; None for tensors that map to no parameter."""
    if gguf_name in _SKIPPED or is_nextn_tensor(gguf_name, args):
        return None
    base, dot, suffix = gguf_name.rpartition(".")
    if dot and base in _GLOBAL and suffix == "weight":
        return f"{_GLOBAL[base]}.weight"
    match = _LAYER_NAME.fullmatch(gguf_name)
    table = {**_LAYER_COMMON, **architecture(args.model_type).gguf_tensors}
    tail = gguf_name.split(".", 2)[2] if match is not None else ""
    # A whole tensor name may map to a whole parameter name ("ssm_dt.bias": "linear_attn.dt_bias").
    if match is None or (tail not in table and (match.group(2) not in table or match.group(3) is None)):
        raise ModelFormatError(f"unknown GGUF tensor {gguf_name!r} for a {args.model_type} model")
    layer = int(match.group(1))
    if layer >= args.num_hidden_layers:
        raise ModelFormatError(f"GGUF tensor {gguf_name!r} names layer {layer} of {args.num_hidden_layers}")
    if tail in table:
        return f"model.layers.{layer}.{table[tail]}"
    return f"model.layers.{layer}.{table[match.group(2)]}.{match.group(3)}"


def is_nextn_tensor(gguf_name: str, args: ModelArgs) -> bool:
    """A tensor of a multi-token-prediction layer (blk.N.* past the model's own layers), which
    the mtp proposer reads (loader/mtp_weights.py), not the model."""
    layers = args.num_hidden_layers
    extra = args.extra.get("nextn_layers", 0)
    return extra > 0 and any(gguf_name.startswith(f"blk.{i}.") for i in range(layers, layers + extra))


def expected_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every HF parameter the model needs, with its shape."""
    h, q, kv = args.hidden_size, args.num_attention_heads * args.head_dim, args.num_key_value_heads * args.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (args.vocab_size, h), "model.norm.weight": (h,)}
    if not args.tie_word_embeddings:
        shapes["lm_head.weight"] = (args.vocab_size, h)
    layer: dict[str, tuple[int, ...]] = {
        "self_attn.q_proj.weight": (q, h),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.o_proj.weight": (h, q),
        "mlp.gate_proj.weight": (args.intermediate_size, h),
        "mlp.up_proj.weight": (args.intermediate_size, h),
        "mlp.down_proj.weight": (h, args.intermediate_size),
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
    }
    if args.attention_bias:
        layer.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)})
    arch = architecture(args.model_type)
    for name in arch.absent_layer_params:
        layer.pop(name)
    layer.update(arch.layer_shapes(args))
    for i in range(args.num_hidden_layers):
        own = arch.layer_params(args, i) if arch.layer_params is not None else layer
        shapes.update({f"model.layers.{i}.{k}": v for k, v in own.items()})
    return shapes


def plan(f: GGUFFile, args: ModelArgs) -> list[tuple[str, str]]:
    """(gguf name, hf name) for every tensor to load; checks names, shapes and completeness
    before any tensor data is read."""
    want = expected_shapes(args)
    pairs: list[tuple[str, str]] = []
    for name in f.tensor_names:
        target = hf_name(name, args)
        if target is None:
            continue
        if target not in want:
            raise ModelFormatError(f"GGUF tensor {name!r} ({target}) is not used by this {args.model_type} model")
        shape = f.tensor_info(name).shape
        if shape != want[target]:
            raise ModelFormatError(f"GGUF tensor {name!r} has shape {shape}, expected {want[target]}")
        pairs.append((name, target))
    missing = sorted(set(want) - {t for _, t in pairs})
    if missing:
        raise ModelFormatError(f"GGUF file lacks tensors for: {', '.join(missing[:5])}"
                               + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    return pairs


# HF parameters that may stay quantized: the weights of linear layers and the embedding.
_PACKABLE = ("_proj.weight", "lm_head.weight", "embed_tokens.weight")
_FLOAT_TYPES = {"F32", "F16", "BF16", "F64"}


def iter_gguf_hf_weights(f: GGUFFile, args: ModelArgs) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (HF parameter name, float32 array in HF layout) for every tensor of the file."""
    for name, target, array, _ in iter_gguf_hf_tensors(f, args, keep_quantized=False):
        yield target, array


def iter_gguf_hf_tensors(
    f: GGUFFile, args: ModelArgs, keep_quantized: bool, kept: Collection[str] = KEPT_TYPES
) -> Iterator[tuple[str, str, np.ndarray, str | None]]:
    """Yield (GGUF name, HF name, array in HF layout, quant type) for every tensor of the file:
    float32 with type None, or, with keep_quantized, the raw uint8 blocks (rows, row bytes) of a
    linear or embedding weight whose GGUF type MLXR multiplies quantized."""
    for name, target in plan(f, args):
        qtype = f.tensor_info(name).ggml_type
        if keep_quantized and qtype in kept and target.endswith(_PACKABLE):
            raw, _ = f.load_raw(name)
            yield name, target, to_hf_layout(target, raw, args), qtype
        else:
            yield name, target, to_hf_layout(target, f.load(name), args), None


def dequantized_types(f: GGUFFile, keep_quantized: bool, kept: Collection[str] = KEPT_TYPES) -> dict[str, int]:
    """How many tensors of each quantized GGUF type are expanded to floats at load."""
    counts: dict[str, int] = {}
    for name in f.tensor_names:
        qtype = f.tensor_info(name).ggml_type
        if qtype not in _FLOAT_TYPES and not (keep_quantized and qtype in kept):
            counts[qtype] = counts.get(qtype, 0) + 1
    return counts


def to_hf_layout(target: str, array: np.ndarray, args: ModelArgs) -> np.ndarray:
    """Undo the converter's changes for one tensor already named in HF terms."""
    arch = architecture(args.model_type)
    if arch.gguf_layout is not None:
        return arch.gguf_layout(target, array, args)
    if arch.gguf_permuted_qk:
        if ".self_attn.q_proj." in target:
            return unpermute_rows(array, args.num_attention_heads)
        if ".self_attn.k_proj." in target:
            return unpermute_rows(array, args.num_key_value_heads)
    if arch.gguf_norm_plus_one and target.endswith("norm.weight"):
        return array - np.float32(1.0)
    return array


def unpermute_rows(array: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's permute(): per head, rows (pair, half) back to (half, pair)."""
    rows = array.shape[0]
    if rows % (2 * n_heads):
        raise ModelFormatError(f"cannot un-permute {rows} rows over {n_heads} heads")
    out = array.reshape(n_heads, rows // n_heads // 2, 2, *array.shape[1:]).swapaxes(1, 2)
    return np.ascontiguousarray(out.reshape(array.shape))

