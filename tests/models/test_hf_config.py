"""config.json -> ModelArgs for llama, mistral, qwen2 and gemma3 (text and multimodal)."""
from __future__ import annotations

import math

import pytest

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.hf_config import args_from_hf_config
from mlxr.model_config import RopeScaling
from mlxr.models import llama
from mlxr.models.model_args import args_from_hf
from mlxr.testing.fixtures import CONFIGS

LLAMA = {
    "model_type": "llama", "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
}
GEMMA3_270M = {
    "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640, "intermediate_size": 2048,
    "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
    "query_pre_attn_scalar": 256, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "sliding_window": 512, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
    "attn_logit_softcapping": None, "rope_scaling": None, "bos_token_id": 2, "eos_token_id": 1,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 5
    + ["full_attention"] + ["sliding_attention"] * 5 + ["full_attention"],
}


def test_llama_defaults() -> None:
    a = args_from_hf(LLAMA)
    assert (a.model_type, a.head_dim, a.num_key_value_heads) == ("llama", 64, 4)
    assert not a.tie_word_embeddings and not a.attention_bias and a.hidden_act == "silu"
    assert a.rope_scaling is None and a.sliding_window is None and a.sliding_layers == ()
    assert a.bos_token_id == 1 and a.eos_token_ids == (2,)
    assert a.query_pre_attn_scalar is None and a.rope_local_base_freq is None
    b = args_from_hf({k: v for k, v in LLAMA.items() if k != "num_key_value_heads"})
    assert b.num_key_value_heads == 32


@pytest.mark.parametrize("key", ["rope_type", "type"])
def test_llama3_rope_scaling(key: str) -> None:
    cfg = {**LLAMA, "rope_scaling": {key: "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    assert args_from_hf(cfg).rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)


def test_rope_parameters_v5_forms() -> None:
    flat = {**LLAMA, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                          "original_max_position_embeddings": 64}}
    flat.pop("rope_theta")
    a = args_from_hf(flat)
    assert a.rope_theta == 500000.0 and a.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 64)
    per_layer = {**GEMMA3_270M, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 12345.0}}}
    g = args_from_hf(per_layer)
    assert g.rope_theta == 1e6 and g.rope_local_base_freq == 12345.0
    assert g.rope_scaling == RopeScaling("linear", 8.0)


@pytest.mark.parametrize("kind", ["dynamic"])
def test_unsupported_rope_scaling(kind: str) -> None:
    with pytest.raises(UnsupportedModelError, match=kind):
        args_from_hf({**LLAMA, "rope_scaling": {"type": kind, "factor": 2.0}})


def test_yarn_reads_its_keys_and_refuses_mscale() -> None:
    rope = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "truncate": False,
            "beta_fast": 32.0, "beta_slow": 1.0}
    s = args_from_hf({**LLAMA, "rope_parameters": {**rope, "rope_theta": 150000.0}}).rope_scaling
    assert (s.rope_type, s.factor, s.original_max_position_embeddings, s.truncate) == ("yarn", 32.0, 4096, False)
    assert s.attention_factor == pytest.approx(0.1 * math.log(32.0) + 1.0)
    with pytest.raises(UnsupportedModelError, match="mscale"):
        args_from_hf({**LLAMA, "rope_scaling": {**rope, "mscale": 0.707, "mscale_all_dim": 0.707}})


def test_longrope_reads_factors_and_defaults_the_attention_factor_as_transformers() -> None:
    half = LLAMA["hidden_size"] // LLAMA["num_attention_heads"] // 2
    rope = {"type": "longrope", "long_factor": [2.0] * half, "short_factor": [1.0] * half}
    cfg = {**LLAMA, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rope_scaling": rope}
    s = args_from_hf(cfg).rope_scaling
    assert (s.rope_type, s.factor, s.original_max_position_embeddings) == ("longrope", 32.0, 4096)
    assert s.long_factor == (2.0,) * half and s.short_factor == (1.0,) * half
    assert s.attention_factor == pytest.approx((1 + math.log(32) / math.log(4096)) ** 0.5)
    with pytest.raises(ModelFormatError, match="long_factor"):
        args_from_hf({**cfg, "rope_scaling": {**rope, "long_factor": None}})


def test_mistral_is_llama_with_sliding_window_everywhere() -> None:
    a = args_from_hf({**LLAMA, "model_type": "mistral", "sliding_window": 4096})
    assert a.model_type == "mistral" and a.sliding_window == 4096 and a.sliding_layers == (True,) * 22
    b = args_from_hf({**LLAMA, "model_type": "mistral", "sliding_window": None})
    assert b.sliding_window is None and b.sliding_layers == ()
    assert args_from_hf({**LLAMA, "sliding_window": 99}).sliding_window is None  # llama has none


def test_qwen2() -> None:
    cfg = {**LLAMA, "model_type": "qwen2", "tie_word_embeddings": True, "sliding_window": 4096,
           "use_sliding_window": False, "eos_token_id": [151645, 151643]}
    a = args_from_hf(cfg)
    assert a.model_type == "qwen2" and a.attention_bias and a.tie_word_embeddings
    assert a.sliding_window is None and a.eos_token_ids == (151645, 151643)
    assert not args_from_hf({**cfg, "tie_word_embeddings": False}).tie_word_embeddings
    assert not args_from_hf({k: v for k, v in cfg.items() if k != "tie_word_embeddings"}).tie_word_embeddings
    swa = args_from_hf({**cfg, "use_sliding_window": True, "max_window_layers": 20})
    assert swa.sliding_window == 4096 and swa.sliding_layers == (False,) * 20 + (True,) * 2


def test_qwen2_declares_its_defaults() -> None:
    """What config.json leaves out comes from qwen2.py's declaration, not from formats/: no
    window unless use_sliding_window says so, a 32k context, biases on q/k/v."""
    cfg = {k: v for k, v in LLAMA.items() if k != "max_position_embeddings"}
    a = args_from_hf({**cfg, "model_type": "qwen2", "sliding_window": 4096})
    assert a.sliding_window is None and a.max_position_embeddings == 32768 and a.attention_bias
    plain = args_from_hf({**cfg, "model_type": "qwen3", "sliding_window": 4096})
    assert plain.sliding_window == 4096 and plain.max_position_embeddings == 4096 and not plain.attention_bias


def test_gemma3_text() -> None:
    a = args_from_hf(GEMMA3_270M)
    assert a.model_type == "gemma3" and a.tie_word_embeddings and a.hidden_act == "gelu_pytorch_tanh"
    assert a.sliding_window == 512 and a.query_pre_attn_scalar == 256 and a.rope_local_base_freq == 10000
    assert [i for i, s in enumerate(a.sliding_layers) if not s] == [5, 11, 17]
    assert a.is_sliding(0) and not a.is_sliding(5)


@pytest.mark.parametrize("pattern_key", ["sliding_window_pattern", "_sliding_window_pattern", None])
def test_gemma3_pattern_without_layer_types(pattern_key: str | None) -> None:
    cfg = {k: v for k, v in GEMMA3_270M.items() if k != "layer_types"}
    if pattern_key:
        cfg[pattern_key] = 3
    globals_ = [i for i, s in enumerate(args_from_hf(cfg).sliding_layers) if not s]
    assert globals_ == ([2, 5, 8, 11, 14, 17] if pattern_key else [5, 11, 17])


def test_gemma3_multimodal_uses_text_config_and_defaults() -> None:
    cfg = {
        "model_type": "gemma3", "eos_token_id": [1, 106],
        "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                        "num_hidden_layers": 34, "sliding_window": 1024,
                        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
        "vision_config": {"hidden_size": 1152},
    }
    a = args_from_hf(cfg)
    assert a.model_type == "gemma3" and a.hidden_size == 2560 and a.num_hidden_layers == 34
    assert (a.num_attention_heads, a.num_key_value_heads, a.head_dim, a.vocab_size) == (8, 4, 256, 262208)
    assert a.rope_scaling == RopeScaling("linear", 8.0) and a.rope_theta == 1e6
    assert a.eos_token_ids == (1, 106) and a.tie_word_embeddings and a.query_pre_attn_scalar == 256
    with pytest.raises(ModelFormatError, match="text_config"):
        args_from_hf({"model_type": "gemma3"})


def test_unknown_model_type_is_named() -> None:
    with pytest.raises(UnsupportedModelError, match="'mamba'"):
        args_from_hf({**LLAMA, "model_type": "mamba"})
    with pytest.raises(UnsupportedModelError, match="None"):
        args_from_hf({k: v for k, v in LLAMA.items() if k != "model_type"})


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size",
                                 "num_attention_heads"])
def test_missing_required_key_is_named(key: str) -> None:
    with pytest.raises(ModelFormatError, match=key):
        args_from_hf({k: v for k, v in LLAMA.items() if k != key})


@pytest.mark.parametrize("key, value", [("hidden_size", "64"), ("hidden_size", -1), ("hidden_size", True),
                                        ("rms_norm_eps", "x"), ("num_key_value_heads", 5),
                                        ("tie_word_embeddings", "yes"), ("eos_token_id", [-1]),
                                        ("bos_token_id", 1.5), ("rope_scaling", "llama3")])
def test_bad_values(key: str, value: object) -> None:
    with pytest.raises(ModelFormatError):
        args_from_hf({**LLAMA, key: value})


def test_bad_activation_and_layer_types() -> None:
    with pytest.raises(UnsupportedModelError, match="relu"):
        args_from_hf({**LLAMA, "hidden_act": "relu"})
    with pytest.raises(ModelFormatError, match="layer_types"):
        args_from_hf({**GEMMA3_270M, "layer_types": ["sliding_attention"]})
    with pytest.raises(ModelFormatError):
        args_from_hf_config([], llama.ARCH)  # type: ignore[arg-type]


def test_fixture_configs_parse() -> None:
    for name, spec in CONFIGS.items():
        a = args_from_hf(spec.config)
        assert a.model_type in (spec.family, spec.config["model_type"]), name  # mistral: its own declaration
    g = args_from_hf(CONFIGS["tiny-gemma3"].config)
    assert g.head_dim == 32 and g.query_pre_attn_scalar == 32 and g.sliding_layers == (True,) * 5 + (False,)
    assert args_from_hf(CONFIGS["tiny-qwen2"].config).head_dim == 16
