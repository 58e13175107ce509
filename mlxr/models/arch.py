"""What the loaders must know about one architecture beyond the shared Llama anatomy.

Each model file declares one `Architecture` next to its math (mlx-lm's habit of keeping config
fields and checkpoint quirks with the model), so a new architecture is one file, its entry in
models/__init__.py's table, and its test. Torch-free: formats/ takes these declarations as plain
arguments and knows no architecture by name.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlxr.model_config import ModelArgs

Shapes = dict[str, tuple[int, ...]]


def _no_fields(_: Any) -> dict[str, Any]:
    return {}


def _no_shapes(_: ModelArgs) -> Shapes:
    return {}


def _same_name(name: str) -> tuple[str, int | None]:
    return name, None


def _always(_: dict) -> bool:
    return True


def _no_fused(_: ModelArgs) -> dict[str, tuple[tuple[str, int], ...]]:
    return {}


@dataclass(frozen=True)
class Architecture:
    name: str  # canonical (ModelArgs.model_type after loading)
    hf_model_types: tuple[str, ...]  # config.json model_type values
    gguf_archs: tuple[str, ...] = ()  # GGUF general.architecture values
    # config.json -> the keys formats/hf_config.py reads (a multimodal config's text part, with
    # this architecture's defaults filled in).
    hf_config: Callable[[dict], dict] = dict
    # The keys above -> ModelArgs fields beyond the shared ones, or in place of them.
    hf_fields: Callable[[dict], dict[str, Any]] = _no_fields
    # (the keys above, layer count) -> (sliding_window, per-layer sliding flags); None: the shared
    # rule (formats/hf_config.sliding_from_config).
    hf_sliding: Callable[[dict, int], tuple[int | None, tuple[bool, ...]]] | None = None
    default_rope_theta: float = 10000.0  # where neither config.json nor the GGUF file gives one
    # The RoPE theta of sliding layers that have their own (config.json rope_local_base_freq's
    # default; GGUF stores none); None where every layer shares one theta.
    local_rope_theta: float | None = None
    # Default max_position_embeddings where config.json has none.
    hf_max_positions: int = 4096
    # GGUF `<arch>.*` reader (formats/gguf_config._Meta) -> ModelArgs fields beyond the shared ones.
    gguf_fields: Callable[[Any], dict[str, Any]] = _no_fields
    # GGUF per-layer tensor base name -> HF parameter path inside the layer, beyond the common ones
    # (loader/gguf_weights.py); the common ffn_norm mapping may be overridden here.
    gguf_tensors: Mapping[str, str] = field(default_factory=dict)
    # Per-layer HF parameters beyond the Llama ones, with their shapes ("self_attn.q_norm.weight").
    layer_shapes: Callable[[ModelArgs], Shapes] = _no_shapes
    # HF per-layer parameters this architecture does not have (Llama names).
    absent_layer_params: tuple[str, ...] = ()
    # Per-layer checkpoint tensors holding several of our parameters stacked by rows, e.g.
    # "self_attn.qkv_proj.weight" -> (("self_attn.q_proj.weight", rows), ...): split at load, from
    # safetensors and GGUF alike (fuse_projections merges them again where it pays).
    fused_tensors: Callable[[ModelArgs], dict[str, tuple[tuple[str, int], ...]]] = _no_fused
    # A checkpoint tensor name -> (our parameter name, expert index or None): per-expert tensors
    # are stacked into one [E, ...] parameter at load (loader/experts.py).
    checkpoint_name: Callable[[str], tuple[str, int | None]] = _same_name
    # Where several architectures share a GGUF architecture name (Mixtral is "llama" with experts):
    # whether this one claims a file, from its metadata.
    gguf_match: Callable[[dict], bool] = _always
    gguf_permuted_qk: bool = False  # llama.cpp's converter permutes q/k rows (LlamaModel subclasses)
    gguf_norm_plus_one: bool = False  # llama.cpp stores Gemma's RMSNorm weights as 1 + w
    # A safetensors checkpoint's (name, tensor) stream -> ours, for layouts a rename cannot undo
    # (gpt-oss: gate and up interleaved by columns, MXFP4 blocks and scales as two tensors);
    # None: the tensors as they are.
    checkpoint_tensors: Callable[[Iterator[tuple[str, Any]]], Iterator[tuple[str, Any]]] | None = None
    # A multimodal config.json (its vision_config present) -> VisionArgs' fields but `preprocess`;
    # None: this architecture takes text only (its tower's weights are skipped).
    hf_vision: Callable[[dict], dict[str, Any]] | None = None
    # Layers of different kinds (a hybrid model): (args, layer) -> that layer's HF parameters and
    # shapes, in place of the Llama ones with layer_shapes; None: every layer alike.
    layer_params: Callable[[ModelArgs, int], Shapes] | None = None
    # (HF name, array, args) -> the array in HF layout, for converters' changes beyond the
    # flags above; None: those flags alone (loader/gguf_weights.to_hf_layout).
    gguf_layout: Callable[[str, Any, ModelArgs], Any] | None = None
    # RoPE turns only part of each head (Qwen3.5): a GGUF rope.dimension_count below the head
    # dimension is taken (gguf_fields reads it), not refused.
    gguf_partial_rotary: bool = False
