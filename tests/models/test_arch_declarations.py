"""The architecture declarations (models/arch.py) and how checkpoints are matched to them."""
from __future__ import annotations

import pytest

from mlxr.errors import ModelFormatError, UnsupportedModelError
from mlxr.formats.gguf_config import args_from_gguf
from mlxr.formats.hf_config import args_from_hf_config
from mlxr.models import ARCHITECTURES, MODELS, gguf_architecture, hf_architecture

LLAMA_GGUF = {"general.architecture": "llama", "llama.embedding_length": 64, "llama.block_count": 2,
              "llama.feed_forward_length": 128, "llama.attention.head_count": 4, "llama.vocab_size": 512}
QWEN3_MOE = {"model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def test_every_declaration_has_a_model_and_unique_hf_types():
    assert set(ARCHITECTURES) == set(MODELS)
    types = [t for a in ARCHITECTURES.values() for t in a.hf_model_types]
    assert len(types) == len(set(types))


def test_a_llama_gguf_with_experts_is_mixtral_and_without_is_llama():
    assert gguf_architecture(LLAMA_GGUF).name == "llama"
    moe = {**LLAMA_GGUF, "llama.expert_count": 4, "llama.expert_used_count": 2}
    arch = gguf_architecture(moe)
    assert arch.name == "mixtral"
    args = args_from_gguf(moe, has_output_tensor=True, declaration=arch)
    assert (args.model_type, args.num_experts, args.num_experts_per_tok) == ("mixtral", 4, 2)


def test_qwen3_moe_fields_and_what_it_refuses():
    arch = hf_architecture(QWEN3_MOE)
    args = args_from_hf_config(QWEN3_MOE, arch)
    assert (args.num_experts, args.moe_intermediate_size, args.norm_topk_prob) == (8, 32, False)
    with pytest.raises(UnsupportedModelError, match="mlp_only_layers"):
        args_from_hf_config({**QWEN3_MOE, "mlp_only_layers": [0]}, arch)
    with pytest.raises(ModelFormatError, match="num_experts_per_tok"):
        args_from_hf_config({k: v for k, v in QWEN3_MOE.items() if k != "num_experts_per_tok"}, arch)


def test_unknown_architectures_are_refused_naming_the_supported_ones():
    with pytest.raises(UnsupportedModelError, match="qwen3_moe"):
        hf_architecture({"model_type": "mamba"})
    with pytest.raises(UnsupportedModelError, match="'mamba'"):
        gguf_architecture({"general.architecture": "mamba"})


def test_registry_imports_new_architectures_from_both_formats(tmp_path):
    from hf_compare import arch_fixture, llama_cpp_gguf
    from mlxr.registry.registry import Registry

    reg = Registry(tmp_path / "home")
    hf = reg.import_model(arch_fixture("tiny-qwen3moe"), "moe")
    assert (hf.format, hf.architecture) == ("safetensors", "qwen3moe")
    gguf = reg.import_model(llama_cpp_gguf(arch_fixture("tiny-mixtral")), "mix")
    assert (gguf.format, gguf.architecture) == ("gguf", "llama")  # the file's own name, as Ollama shows it
