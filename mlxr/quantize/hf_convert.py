"""Hugging Face checkpoint -> GGUF in llama.cpp's conventions (convert_hf_to_gguf.py):
gguf-py's tensor name map, Q/K row permutation for llama, 1 + w RMSNorm weights for
gemma3, a rope_freqs tensor for llama3 rope scaling, and `<arch>.*` hyperparameters.

Names come from gguf-py's own map, not from mlxr's loader, so the loader's GGUF -> HF
mapping is checked against an independent writer (the test fixtures use this module too).
"""
from __future__ import annotations

import math

import gguf
import numpy as np

from mlxr.errors import UnsupportedModelError
from mlxr.model_config import ModelArgs, RopeScaling
from mlxr.models.model_args import args_from_hf

GGUF_ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "gemma3": gguf.MODEL_ARCH.GEMMA3}
# The architectures converted, by canonical name -> the family they convert as (llama.cpp writes
# Mistral as "llama").
_CONVERTED = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "gemma3": "gemma3"}
ROPE_FREQS = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight"
# Checkpoint entries the converter drops: buffers, not parameters.
_SKIPPED_SUFFIXES = (".rotary_emb.inv_freq",)
# A multimodal Gemma 3 checkpoint nests the text model here.
_TEXT_PREFIXES = ("language_model.",)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's permute: per head, rows (half, pair) -> (pair, half)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(scaling: RopeScaling, head_dim: int, theta: float) -> np.ndarray:
    """The rope_freqs tensor convert_hf_to_gguf writes for llama3 rope scaling."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    old = scaling.original_max_position_embeddings
    lo, hi, factor = scaling.low_freq_factor, scaling.high_freq_factor, scaling.factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


class HFToGGUF:
    """Names, layouts and hyperparameters of one HF model (its parsed config.json) in GGUF terms."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.args: ModelArgs = args_from_hf(config)
        if self.args.model_type not in _CONVERTED:
            raise UnsupportedModelError(f"model_type {config.get('model_type')!r} is not supported by the "
                                        f"quantizer (supported: {', '.join(_CONVERTED)})")
        self.family = _CONVERTED[self.args.model_type]
        self.arch = GGUF_ARCH[self.family]
        self.arch_name = gguf.MODEL_ARCH_NAMES[self.arch]
        self._names = gguf.get_tensor_name_map(self.arch, self.args.num_hidden_layers)

    def gguf_name(self, hf_name: str) -> str | None:
        """The GGUF tensor name of a checkpoint tensor; None for tensors llama.cpp drops."""
        if hf_name.endswith(_SKIPPED_SUFFIXES):
            return None
        if hf_name == "lm_head.weight" and self.args.tie_word_embeddings:
            return None  # a tied checkpoint that still stores the head: the embedding is used
        base, _, suffix = hf_name.rpartition(".")
        for prefix in _TEXT_PREFIXES:
            base = base.removeprefix(prefix)
        mapped = self._names.get_name(base)
        if mapped is None or suffix not in ("weight", "bias"):
            raise UnsupportedModelError(f"checkpoint tensor {hf_name!r} has no GGUF name for {self.arch_name}")
        return f"{mapped}.{suffix}"

    def convert(self, hf_name: str, value: np.ndarray) -> np.ndarray:
        """A checkpoint tensor (float32, HF layout) in the layout llama.cpp expects."""
        a = self.args
        if self.family == "llama" and ".self_attn.q_proj." in hf_name:
            value = llama_cpp_permute(value, a.num_attention_heads)
        elif self.family == "llama" and ".self_attn.k_proj." in hf_name:
            value = llama_cpp_permute(value, a.num_key_value_heads)
        elif self.family == "gemma3" and hf_name.endswith("norm.weight"):
            value = value + np.float32(1.0)  # gemma computes x * (1 + w); llama.cpp stores 1 + w
        return np.ascontiguousarray(value, dtype=np.float32)

    def extra_tensors(self) -> list[tuple[str, np.ndarray]]:
        """Tensors the converter computes rather than copies."""
        s = self.args.rope_scaling
        if s is not None and s.rope_type == "llama3":
            return [(ROPE_FREQS, llama3_rope_factors(s, self.args.head_dim, self.args.rope_theta))]
        return []

    def write_hparams(self, w: gguf.GGUFWriter) -> None:
        """The `<arch>.*` keys convert_hf_to_gguf writes for this family."""
        a, text = self.args, self._text_config()
        w.add_context_length(a.max_position_embeddings)
        w.add_embedding_length(a.hidden_size)
        w.add_block_count(a.num_hidden_layers)
        w.add_feed_forward_length(a.intermediate_size)
        w.add_head_count(a.num_attention_heads)
        w.add_head_count_kv(a.num_key_value_heads)
        w.add_layer_norm_rms_eps(a.rms_norm_eps)
        w.add_rope_freq_base(a.rope_theta)
        if "head_dim" in text or self.family == "gemma3":
            w.add_key_length(a.head_dim)
            w.add_value_length(a.head_dim)
        if self.family == "llama":
            w.add_vocab_size(a.vocab_size)
            w.add_rope_dimension_count(a.head_dim)
        if self.family in ("gemma3", "llama") and a.sliding_window is not None:
            # llama.cpp's converter writes no window for Mistral; MLXR's GGUF reader honours this key
            w.add_sliding_window(a.sliding_window)
        if a.rope_scaling is not None and a.rope_scaling.rope_type == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(a.rope_scaling.factor)

    def _text_config(self) -> dict:
        text = self.config.get("text_config")
        return text if self.config.get("model_type") == "gemma3" and isinstance(text, dict) else self.config
