"""Hugging Face config.json -> ModelArgs, with the architecture's declaration (models/arch.py)
for what only it knows.

Accepts both the classic keys (rope_theta, rope_scaling, rope_local_base_freq) and the
transformers v5 `rope_parameters` form (flat, or per layer type).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.limits import check_layer_count, check_sizes
from mlxr.model_config import ModelArgs, RopeScaling

_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_pytorch_tanh", "gelu_tanh": "gelu_pytorch_tanh"}
_SLIDING, _FULL = "sliding_attention", "full_attention"


def args_from_hf_config(config: dict, arch: Any) -> ModelArgs:
    """Build ModelArgs from a parsed config.json and its architecture's declaration
    (models/arch.Architecture: models.model_args.args_from_hf finds it). Raises ModelFormatError
    (naming the key) for a missing or bad value."""
    if not isinstance(config, dict):
        raise ModelFormatError("config.json must hold a JSON object")
    cfg = arch.hf_config(config)
    args = replace(_build(cfg, arch, config.get("model_type")), **arch.hf_fields(cfg))
    return check_sizes(args, "config.json")


def _build(cfg: dict, arch: Any, model_type: str) -> ModelArgs:
    hidden = _pos_int(cfg, "hidden_size")
    heads = _pos_int(cfg, "num_attention_heads")
    kv_heads = _pos_int(cfg, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise ModelFormatError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    head_dim = _pos_int(cfg, "head_dim", hidden // heads if hidden % heads == 0 else None)
    layers = check_layer_count(_pos_int(cfg, "num_hidden_layers"), "config.json num_hidden_layers")
    if cfg.get("mlp_bias"):
        raise UnsupportedModelError("mlp_bias=true is not supported")
    theta, scaling, local_theta = _rope(cfg, arch)
    sliding_window, sliding_layers = (arch.hf_sliding or sliding_from_config)(cfg, layers)
    return ModelArgs(
        model_type=arch.name,
        vocab_size=_pos_int(cfg, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_pos_int(cfg, "intermediate_size"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=_pos_float(cfg, "rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=_pos_int(cfg, "max_position_embeddings", arch.hf_max_positions),
        tie_word_embeddings=_bool(cfg, "tie_word_embeddings", False),
        attention_bias=_bool(cfg, "attention_bias", False),
        hidden_act=activation(cfg, "silu"),
        sliding_window=sliding_window,
        sliding_layers=sliding_layers,
        rope_local_base_freq=local_theta,
        query_pre_attn_scalar=None,
        final_logit_softcapping=_opt_float(cfg, "final_logit_softcapping"),
        attn_logit_softcapping=_opt_float(cfg, "attn_logit_softcapping"),
        bos_token_id=_opt_token(cfg, "bos_token_id"),
        eos_token_ids=_eos_ids(cfg),
        extra={"hf_model_type": model_type},
    )


def _rope(cfg: dict, arch: Any) -> tuple[float, RopeScaling | None, float | None]:
    """(theta of global layers, their scaling, theta of sliding layers that have their own)."""
    params = cfg.get("rope_parameters")
    local_theta = None
    if isinstance(params, dict) and isinstance(params.get(_FULL), dict):
        local = params.get(_SLIDING) or {}
        local_theta = _opt_float(local, "rope_theta") if isinstance(local, dict) else None
        params = params[_FULL]
    if isinstance(params, dict):
        theta = _pos_float(params, "rope_theta", _pos_float(cfg, "rope_theta", arch.default_rope_theta))
        scaling = _rope_scaling(params, "rope_parameters")
    else:
        theta = _pos_float(cfg, "rope_theta", arch.default_rope_theta)
        scaling = _rope_scaling(cfg.get("rope_scaling"), "rope_scaling")
    if scaling is not None and scaling.rope_type == "longrope":
        scaling = _longrope(cfg, params if isinstance(params, dict) else cfg.get("rope_scaling"))
    if arch.local_rope_theta is not None:
        local_theta = local_theta or _pos_float(cfg, "rope_local_base_freq", arch.local_rope_theta)
    return theta, scaling, local_theta


def _rope_scaling(raw: Any, key: str) -> RopeScaling | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ModelFormatError(f"{key} must be an object or null")
    kind = raw.get("rope_type", raw.get("type", "default"))
    if kind == "default":
        return None
    if kind == "linear":
        return RopeScaling(rope_type="linear", factor=_pos_float(raw, "factor"))
    if kind == "llama3":
        return RopeScaling(
            rope_type="llama3",
            factor=_pos_float(raw, "factor"),
            low_freq_factor=_pos_float(raw, "low_freq_factor", 1.0),
            high_freq_factor=_pos_float(raw, "high_freq_factor", 4.0),
            original_max_position_embeddings=_pos_int(raw, "original_max_position_embeddings", 8192),
        )
    if kind in ("longrope", "su"):
        return RopeScaling(rope_type="longrope")  # completed by _longrope, which needs the whole config
    if kind == "yarn":
        return _yarn(raw, key)
    raise UnsupportedModelError(f"{key} type {kind!r} is not supported (default, linear, llama3, longrope, yarn)")


def _yarn(raw: dict, key: str) -> RopeScaling:
    """YaRN as transformers reads it; DeepSeek's mscale variant and a factor left to be derived
    from max_position_embeddings are refused."""
    if raw.get("mscale") or raw.get("mscale_all_dim"):
        raise UnsupportedModelError(f"{key} yarn with mscale / mscale_all_dim is not supported")
    if raw.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedModelError("partial_rotary_factor other than 1 is not supported")
    factor = _pos_float(raw, "factor")
    default_attn = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    return RopeScaling("yarn", factor, original_max_position_embeddings=_pos_int(raw, "original_max_position_embeddings"),
                       attention_factor=_pos_float(raw, "attention_factor", default_attn),
                       beta_fast=_pos_float(raw, "beta_fast", 32.0), beta_slow=_pos_float(raw, "beta_slow", 1.0),
                       truncate=_bool(raw, "truncate", True))


def _longrope(cfg: dict, raw: dict) -> RopeScaling:
    """Phi-3's LongRoPE; factor and attention factor default as transformers computes them."""
    if raw.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModelError("partial_rotary_factor other than 1 is not supported")
    orig = _pos_int(raw, "original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
    factor = _pos_float(raw, "factor", _pos_int(cfg, "max_position_embeddings") / orig)
    default_attn = math.sqrt(1 + math.log(factor) / math.log(orig)) if factor > 1.0 else 1.0
    long_f, short_f = _factors(raw, "long_factor"), _factors(raw, "short_factor")
    if len(long_f) != len(short_f):
        raise ModelFormatError("rope long_factor and short_factor differ in length")
    return RopeScaling("longrope", factor, original_max_position_embeddings=orig, long_factor=long_f,
                       short_factor=short_f, attention_factor=_pos_float(raw, "attention_factor", default_attn))


def _factors(raw: dict, key: str) -> tuple[float, ...]:
    value = raw.get(key)
    if not isinstance(value, list) or not value or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value):
        raise ModelFormatError(f"rope {key} must be a list of positive numbers")
    return tuple(float(v) for v in value)


def sliding_from_config(cfg: dict, layers: int, *, flag_rules: bool = False,
                        pattern: Callable[[dict, int], tuple[bool, ...]] | None = None,
                        ) -> tuple[int | None, tuple[bool, ...]]:
    """(sliding_window, per-layer sliding flags): the window of `sliding_window`, off where
    `use_sliding_window` is false (or absent, with flag_rules), on the layers `layer_types`
    names, else those of `pattern(cfg, layers)`, else from `max_window_layers` on where the flag
    rules, else on every layer."""
    window = cfg.get("sliding_window")
    flag_rules = flag_rules or "use_sliding_window" in cfg
    if flag_rules and not cfg.get("use_sliding_window", False):
        window = None
    if window is None:
        return None, ()
    window = _pos_int(cfg, "sliding_window")
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        return window, _from_layer_types(layer_types, layers)
    if pattern is not None:
        return window, pattern(cfg, layers)
    if flag_rules:
        first = cfg.get("max_window_layers") or 0
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ModelFormatError(f"max_window_layers must be a non-negative integer, got {first!r}")
        return window, tuple(i >= first for i in range(layers))
    return window, (True,) * layers


def no_sliding(cfg: dict, layers: int) -> tuple[None, tuple[bool, ...]]:
    """For architectures without sliding windows, whatever config.json says."""
    return None, ()


def _from_layer_types(layer_types: Any, layers: int) -> tuple[bool, ...]:
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        raise ModelFormatError(f"layer_types must be a list of {layers} entries")
    bad = [t for t in layer_types if t not in (_SLIDING, _FULL)]
    if bad:
        raise UnsupportedModelError(f"layer_types entry {bad[0]!r} is not supported")
    return tuple(t == _SLIDING for t in layer_types)


def activation(cfg: dict, default: str) -> str:
    """The MLP activation (hidden_activation, else hidden_act, else `default`)."""
    key = "hidden_activation" if cfg.get("hidden_activation") is not None else "hidden_act"
    name = cfg.get(key) or default
    if name not in _ACTIVATIONS:
        raise UnsupportedModelError(f"{key} {name!r} is not supported")
    return _ACTIVATIONS[name]


def _eos_ids(cfg: dict) -> tuple[int, ...]:
    raw = cfg.get("eos_token_id")
    items = raw if isinstance(raw, list) else [raw]
    return tuple(_token(v, "eos_token_id") for v in items if v is not None)


def _opt_token(cfg: dict, key: str) -> int | None:
    value = cfg.get(key)
    return None if value is None else _token(value, key)


def _token(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelFormatError(f"{key} must be a non-negative integer, got {value!r}")
    return value


_MISSING = object()


def _get(cfg: dict, key: str, default: Any) -> Any:
    value = cfg.get(key)
    if value is not None:
        return value
    if default is _MISSING or default is None:
        raise ModelFormatError(f"config.json lacks required key {key!r}")
    return default


def positive(cfg: dict, key: str, default: int) -> int:
    """A positive integer key of an architecture's own part of config.json (a vision_config)."""
    return _pos_int(cfg, key, default)


def _pos_int(cfg: dict, key: str, default: Any = _MISSING) -> int:
    value = _get(cfg, key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelFormatError(f"config.json key {key!r} must be a positive integer, got {value!r}")
    return value


def _pos_float(cfg: dict, key: str, default: Any = _MISSING) -> float:
    value = _get(cfg, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ModelFormatError(f"config.json key {key!r} must be a positive number, got {value!r}")
    return float(value)


def _opt_float(cfg: dict, key: str) -> float | None:
    return None if cfg.get(key) is None else _pos_float(cfg, key)


def _bool(cfg: dict, key: str, default: bool) -> bool:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelFormatError(f"config.json key {key!r} must be true or false, got {value!r}")
    return value


# Typed readers for the fields an architecture declares (models/*.py hf_fields).
positive_int = _pos_int
positive_float = _pos_float
optional_float = _opt_float
boolean = _bool
