"""What the loaders must know about one architecture beyond the shared Llama anatomy.

Each model file declares one `Architecture` next to its math (mlx-lm's habit of keeping config
fields and checkpoint quirks with the model), so a new architecture is one file plus its test.
Torch-free: formats/ takes these declarations as plain arguments.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlxr.config import ModelArgs

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
    # config.json (dict) -> ModelArgs fields beyond the shared ones (formats/hf_config.py).
    hf_fields: Callable[[dict], dict[str, Any]] = _no_fields
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
