"""GGUF metadata -> ModelArgs, following llama.cpp's conventions, with the architecture's
declaration (models/arch.py) for the fields only it has and what its files leave out.

The `llama3` rope scaling is stored as a `rope_freqs` tensor of per-frequency divisors, which
`llama3_scaling_from_factors` turns back into RopeScaling.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.gguf import GGUFFile
from mlxr.formats.limits import check_layer_count, check_layers_present, check_sizes
from mlxr.model_config import ModelArgs, RopeScaling

# Token texts llama.cpp also treats as end of generation.
_EOG_TEXTS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>")


def args_from_gguf(
    metadata: dict[str, Any],
    *,
    has_output_tensor: bool,
    vocab_size: int | None = None,
    rope_freqs: Sequence[float] | None = None,
    declaration: Any,
    tensors: Callable[[str], np.ndarray | None] | None = None,
) -> ModelArgs:
    """Build ModelArgs from GGUF metadata. `vocab_size` is token_embd's row count (it wins
    over the tokenizer's token count); `rope_freqs` is the `rope_freqs.weight` tensor.
    `declaration` (models/arch.Architecture: models.model_args.gguf_architecture finds it)
    adds the fields only its architecture has."""
    arch = metadata.get("general.architecture")
    m = _Meta(metadata, arch, tensors)
    hidden = m.pos_int("embedding_length")
    heads = m.pos_int("attention.head_count")
    kv_heads = m.pos_int("attention.head_count_kv", heads)
    if heads % kv_heads:
        raise ModelFormatError(f"GGUF head_count {heads} is not a multiple of head_count_kv {kv_heads}")
    head_dim = _head_dim(m, hidden, heads, declaration.gguf_partial_rotary)
    layers = check_layer_count(main_layer_count(m), f"GGUF {arch}.block_count")
    theta = m.pos_float("rope.freq_base", declaration.default_rope_theta)
    window, sliding = _uniform_window(m, layers)
    args = ModelArgs(
        model_type=declaration.name,
        vocab_size=_vocab_size(m, vocab_size),
        hidden_size=hidden,
        intermediate_size=m.pos_int("feed_forward_length"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=m.pos_float("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=theta,
        rope_scaling=_rope_scaling(m, rope_freqs, head_dim, theta),
        max_position_embeddings=m.pos_int("context_length", 4096),
        tie_word_embeddings=not has_output_tensor,
        attention_bias=False,
        hidden_act="silu",
        sliding_window=window,
        sliding_layers=sliding,
        rope_local_base_freq=declaration.local_rope_theta,
        final_logit_softcapping=m.opt_float("final_logit_softcapping"),
        attn_logit_softcapping=m.opt_float("attn_logit_softcapping"),
        bos_token_id=_token_id(metadata, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=_eos_ids(metadata),
        extra={"gguf_architecture": arch, **_pooling(m), **_nextn(m)},
    )
    return check_sizes(replace(args, **declaration.gguf_fields(m)), "GGUF")


def nextn_layer_count(m: "_Meta") -> int:
    """The multi-token-prediction layers llama.cpp's converter appends to block_count
    (`nextn_predict_layers`; blk.N.* past the model's own layers: loader/mtp_weights.py reads them)."""
    value = m.raw("nextn_predict_layers")
    if value is None or value == 0:
        return 0
    n = m.pos_int("nextn_predict_layers")
    if n >= m.pos_int("block_count"):
        raise ModelFormatError(f"GGUF {m.arch}.nextn_predict_layers {n} leaves no layer of block_count "
                               f"{m.pos_int('block_count')}")
    return n


def main_layer_count(m: "_Meta") -> int:
    """block_count without the multi-token-prediction layers."""
    return m.pos_int("block_count") - nextn_layer_count(m)


def _nextn(m: "_Meta") -> dict[str, int]:
    n = nextn_layer_count(m)
    return {"nextn_layers": n} if n else {}


# llama.cpp's `<arch>.pooling_type` values that give one vector per input (an embedding model's).
_POOLING = {1: "mean", 2: "cls", 3: "last"}


def _pooling(m: "_Meta") -> dict[str, str]:
    """An embedding model's pooling (Qwen3-Embedding's GGUF says last), where the file says one."""
    mode = _POOLING.get(m.raw("pooling_type"))
    return {"pooling": mode} if mode else {}


class _Meta:
    """Typed access to `{arch}.*` keys; every bad value names its key."""

    def __init__(self, metadata: dict[str, Any], arch: str,
                 tensors: Callable[[str], np.ndarray | None] | None = None) -> None:
        self.metadata = metadata
        self.arch = arch
        self._tensors = tensors

    def tensor(self, name: str) -> np.ndarray | None:
        """A small global tensor of the file (rope factors), None where absent."""
        return self._tensors(name) if self._tensors is not None else None

    def raw(self, key: str) -> Any:
        return self.metadata.get(f"{self.arch}.{key}")

    def pos_int(self, key: str, default: int | None = None) -> int:
        value = self.raw(key)
        if isinstance(value, list) and value and all(v == value[0] for v in value):
            value = value[0]  # a per-layer array with one value
        if value is None:
            if default is None:
                raise ModelFormatError(f"GGUF metadata lacks required key {self.arch}.{key}")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelFormatError(f"GGUF {self.arch}.{key} must be a positive integer, got {value!r}")
        return value

    def pos_float(self, key: str, default: float) -> float:
        value = self.opt_float(key)
        return default if value is None else value

    def opt_float(self, key: str) -> float | None:
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ModelFormatError(f"GGUF {self.arch}.{key} must be a positive number, got {value!r}")
        # float32 in the file: take its shortest decimal (1e-06, not 9.99999997e-07)
        return float(str(np.float32(value))) if isinstance(value, float) else float(value)


def _head_dim(m: _Meta, hidden: int, heads: int, partial_rotary: bool = False) -> int:
    """llama.cpp's rule: key_length, else hidden / heads; rope.dimension_count is how many of those
    dimensions rotate, and a file that rotates fewer (Phi-4-mini's partial rotary) is refused
    unless its architecture rotates part of each head (its declaration's gguf_fields reads it)."""
    head_dim = m.pos_int("attention.key_length", hidden // heads)
    rotated = m.pos_int("rope.dimension_count", head_dim)
    if rotated != head_dim and not partial_rotary:
        raise UnsupportedModelError(f"GGUF {m.arch}.rope.dimension_count {rotated} is less than the head "
                                    f"dimension {head_dim}: partial rotary embeddings are not supported")
    return head_dim


def _vocab_size(m: _Meta, from_tensor: int | None) -> int:
    if from_tensor is not None:
        return from_tensor
    tokens = m.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens:
        return len(tokens)
    return m.pos_int("vocab_size")


def yarn_scaling(m: _Meta, truncate: bool) -> RopeScaling:
    """YaRN from llama.cpp's keys; `truncate` is the architecture's convention (GGUF stores none)."""
    factor = m.pos_float("rope.scaling.factor", 1.0)
    default_attn = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    return RopeScaling("yarn", factor, original_max_position_embeddings=m.pos_int("rope.scaling.original_context_length"),
                       attention_factor=m.pos_float("rope.scaling.attn_factor", default_attn),
                       beta_fast=m.pos_float("rope.scaling.yarn_beta_fast", 32.0),
                       beta_slow=m.pos_float("rope.scaling.yarn_beta_slow", 1.0), truncate=truncate)


def _uniform_window(m: _Meta, layers: int) -> tuple[int | None, tuple[bool, ...]]:
    """A window on every layer where the file names one (0 or absent: none)."""
    window = m.raw("attention.sliding_window")
    if not window:
        return None, ()
    return m.pos_int("attention.sliding_window"), (True,) * layers


def _rope_scaling(
    m: _Meta, rope_freqs: Sequence[float] | None, head_dim: int, theta: float
) -> RopeScaling | None:
    kind = m.raw("rope.scaling.type")
    if kind not in (None, "none", "linear", "yarn"):
        raise UnsupportedModelError(f"GGUF rope scaling type {kind!r} is not supported")
    if kind == "yarn":
        return yarn_scaling(m, truncate=True)
    if kind == "linear":
        factor = m.pos_float("rope.scaling.factor", 1.0)
        return None if factor == 1.0 else RopeScaling(rope_type="linear", factor=factor)
    if rope_freqs is not None:
        return llama3_scaling_from_factors(rope_freqs, head_dim, theta)
    return None


def llama3_scaling_from_factors(factors: Sequence[float], head_dim: int, theta: float) -> RopeScaling | None:
    """Recover llama3 RopeScaling from llama.cpp's rope_freqs divisors (one per frequency).

    The factors depend only on factor, original_max/low_freq_factor and
    original_max/high_freq_factor, so low_freq_factor is fixed to 1 without loss."""
    f = np.asarray(factors, dtype=np.float64).reshape(-1)
    if f.size != head_dim // 2 or not np.all(np.isfinite(f)) or np.any(f <= 0):
        raise ModelFormatError(f"GGUF rope_freqs must hold {head_dim // 2} positive numbers")
    factor = _round6(float(f.max()))  # stored as float32
    if np.allclose(f, 1.0, rtol=1e-6):
        return None
    wavelen = 2 * math.pi * theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = _fit_llama3(f, wavelen, factor)
    if not np.allclose(llama3_factors(scaling, head_dim, theta), f, rtol=1e-4, atol=1e-6):
        raise UnsupportedModelError("GGUF rope_freqs do not follow the llama3 rope scaling rule")
    return scaling


def _fit_llama3(f: np.ndarray, wavelen: np.ndarray, factor: float) -> RopeScaling:
    ones = np.isclose(f, 1.0, rtol=1e-6)
    full = np.isclose(f, factor, rtol=1e-6)
    mid = ~ones & ~full
    # 1/f = (1 - s)/factor + s, with s linear in 1/wavelen between the two wavelength limits
    s = (1 / f[mid] - 1 / factor) / (1 - 1 / factor)
    if mid.sum() >= 2:
        slope, intercept = np.polyfit(1 / wavelen[mid], s, 1)
        high = 1 - 1 / intercept  # with low_freq_factor = 1: intercept = -1 / (high - 1)
        orig = slope * (high - 1)
        return RopeScaling("llama3", factor, 1.0, _round6(high), int(round(orig)))
    if mid.sum() == 1:
        orig = float(wavelen[mid][0] * (3 * s[0] + 1))  # high_freq_factor = 4
        return RopeScaling("llama3", factor, 1.0, 4.0, int(round(orig)))
    lo = 4 * wavelen[ones].max() if ones.any() else 0.0
    hi = wavelen[full].min() if full.any() else 4 * lo + 1
    return RopeScaling("llama3", factor, 1.0, 4.0, int(math.floor((lo + hi) / 2)))


def _round6(x: float) -> float:
    return float(f"{x:.6g}")


def llama3_factors(scaling: RopeScaling, head_dim: int, theta: float) -> np.ndarray:
    """The rope_freqs divisors llama.cpp's converter writes for a llama3 RopeScaling."""
    wavelen = 2 * math.pi * theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    orig = scaling.original_max_position_embeddings
    low_wavelen = orig / scaling.low_freq_factor
    high_wavelen = orig / scaling.high_freq_factor
    smooth = (orig / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    mid = 1 / ((1 - smooth) / scaling.factor + smooth)
    return np.where(wavelen < high_wavelen, 1.0, np.where(wavelen > low_wavelen, scaling.factor, mid))


def _token_id(metadata: dict[str, Any], key: str) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelFormatError(f"GGUF {key} must be a non-negative integer, got {value!r}")
    return value


def _eos_ids(metadata: dict[str, Any]) -> tuple[int, ...]:
    ids = [_token_id(metadata, "tokenizer.ggml.eos_token_id"), _token_id(metadata, "tokenizer.ggml.eot_token_id")]
    tokens = metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        wanted = set(_EOG_TEXTS)
        ids += [i for i, t in enumerate(tokens) if t in wanted]
    out: list[int] = []
    for i in ids:
        if i is not None and i not in out:
            out.append(i)
    return tuple(out)


def args_from_gguf_file(f: GGUFFile, declaration: Any) -> ModelArgs:
    """args_from_gguf with what only the tensors tell: vocab rows, lm_head, rope_freqs."""
    vocab = f.tensor_info("token_embd.weight").shape[0] if "token_embd.weight" in f else None
    rope_freqs = f.load("rope_freqs.weight") if "rope_freqs.weight" in f else None
    args = args_from_gguf(f.metadata, has_output_tensor="output.weight" in f, vocab_size=vocab,
                          rope_freqs=rope_freqs, declaration=declaration,
                          tensors=lambda name: f.load(name) if name in f else None)
    if not args.attention_bias and "blk.0.attn_q.bias" in f:  # a llama with q/k/v biases
        args = replace(args, attention_bias=True)
    # The multi-token-prediction layers are numbered after the model's own.
    check_layers_present(args.num_hidden_layers + args.extra.get("nextn_layers", 0), f.tensor_names, "blk.",
                         "the GGUF file")
    return args
