"""Tiny random models of the architectures added after llama/qwen2/gemma3, written by HF
transformers itself (its real model class, save_pretrained), to be converted to GGUF by llama.cpp's
own convert_hf_to_gguf.py (testing/llama_cpp_convert.py).

Every parameter gets seeded random values by name (norm weights near their neutral value, so
the norms matter), and the fixture tokenizer's files sit beside the weights. Needs transformers
(a test dependency).
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlxr.testing import fixture_tokenizer as ft
from mlxr.testing.write_once import write_once

ARCH_FIXTURE_VERSION = 1  # bump when the written files change


@dataclass(frozen=True)
class ArchFixture:
    config: dict  # config.json as transformers' config class takes it
    tokenizer: ft.TokenizerSpec = ft.QWEN2
    seed: int = 0
    gemma_norms: bool = False  # norms compute x * (1 + w): w near 0


_BASE = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
         "max_position_embeddings": 256, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 2}

ARCH_FIXTURES: dict[str, ArchFixture] = {
    "tiny-qwen3": ArchFixture({**_BASE, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                               "rope_theta": 1000000.0}, seed=10),
    # A window of 8 on every layer, well inside the tests' 24-token prompt.
    "tiny-mistral": ArchFixture({**_BASE, "model_type": "mistral", "architectures": ["MistralForCausalLM"],
                                 "sliding_window": 8, "bos_token_id": 1, "eos_token_id": 2},
                                tokenizer=ft.LLAMA, seed=11),
    # Multipliers far from 1, so that each one missing shows in the logits.
    "tiny-granite": ArchFixture({**{k: v for k, v in _BASE.items() if k != "head_dim"}, "model_type": "granite",
                                 "architectures": ["GraniteForCausalLM"], "embedding_multiplier": 6.0,
                                 "residual_multiplier": 0.3, "attention_multiplier": 0.09, "logits_scaling": 4.0},
                                seed=12),
    "tiny-olmo2": ArchFixture({**_BASE, "model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"],
                               "rope_theta": 500000.0}, tokenizer=ft.LLAMA, seed=13),
    # Windows of 8 on layers 0 and 2 inside a 24-token prompt; caps low enough to bite (the tests
    # check that they do); query_pre_attn_scalar = head_dim, the only value GGUF can express.
    "tiny-gemma2": ArchFixture({**_BASE, "model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"],
                                "num_hidden_layers": 4, "sliding_window": 8, "query_pre_attn_scalar": 16,
                                "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                                "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
                                "bos_token_id": 2, "eos_token_id": 1},
                               tokenizer=ft.GEMMA, seed=14, gemma_norms=True),
    # LongRoPE with an original context of 16: the 24-token prompt runs on the long factors,
    # an 8-token prompt with 7 more tokens on the short ones; factor 256 / 16 gives cos/sin x 1.41.
    "tiny-phi3": ArchFixture({**{k: v for k, v in _BASE.items() if k != "head_dim"}, "model_type": "phi3",
                              "architectures": ["Phi3ForCausalLM"], "original_max_position_embeddings": 16,
                              "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                                  "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
                                                  "short_factor": [1.0, 1.0, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0]},
                              "pad_token_id": 0}, tokenizer=ft.LLAMA, seed=15),
    # gpt-oss: a window of 8 on layer 0 inside the 24-token prompt; YaRN over an original 64
    # positions (cos/sin x 1.14, the low frequencies interpolated), truncated as llama.cpp always
    # does (arch_variants.py has the released configs' untruncated one); 4 experts, 2 picked.
    "tiny-gpt_oss": ArchFixture({**_BASE, "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"],
                                 "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32,
                                 "sliding_window": 8,
                                 "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                                     "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True,
                                                     "original_max_position_embeddings": 64}}, seed=20),
    # Gemma 4 with every text feature on: windows of 8 on the even layers, the last two layers
    # reading layers 2's and 3's K/V (double-wide MLPs), values equal to keys on full layers,
    # per-layer inputs of 8, 2 of 4 experts beside each MLP, a final soft-cap.
    "tiny-gemma4": ArchFixture({**_BASE, "model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"],
                                "num_hidden_layers": 6, "sliding_window": 8, "hidden_activation": "gelu_pytorch_tanh",
                                "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
                                "layer_types": ["sliding_attention", "full_attention"] * 3,
                                "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                    "full_attention": {"rope_type": "default", "rope_theta": 1e6}},
                                "global_head_dim": 16, "vocab_size_per_layer_input": 512,
                                "hidden_size_per_layer_input": 8, "num_kv_shared_layers": 2, "attention_k_eq_v": True,
                                "use_double_wide_mlp": True, "enable_moe_block": True, "num_experts": 4,
                                "top_k_experts": 2, "moe_intermediate_size": 32, "final_logit_softcapping": 2.0},
                               tokenizer=ft.GEMMA, seed=21),
    # More experts than the router picks, so routing matters.
    "tiny-mixtral": ArchFixture({**_BASE, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
                                 "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64},
                                tokenizer=ft.LLAMA, seed=16),
    "tiny-qwen3moe": ArchFixture({**_BASE, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
                                  "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                  "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []},
                                 seed=17),
}


def random_value(seed: int, name: str, shape: tuple[int, ...], gemma_norms: bool) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    x = rng.standard_normal(shape, dtype=np.float32)
    if name.endswith("mlp.gate.weight"):  # a MoE router: logits far apart, so no near-ties in top-k
        return x
    if "norm" in name and x.ndim == 1:
        if gemma_norms:  # on a 2**-12 grid, so that GGUF's stored 1 + w is exact
            return np.round(x * np.float32(0.1 * 4096)) / np.float32(4096)
        return np.float32(1.0) + np.float32(0.1) * x
    return x * np.float32(0.1)


def write_hf(name: str, out_dir: Path, spec: ArchFixture | None = None) -> Path:
    """save_pretrained of transformers' own model class, with every parameter randomised."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = spec or ARCH_FIXTURES[name]
    cfg = dict(spec.config)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            value = random_value(spec.seed, pname, tuple(param.shape), spec.gemma_norms)
            param.copy_(torch.from_numpy(value))
    hf_dir = Path(out_dir) / "hf"
    model.save_pretrained(hf_dir)
    tok = ft.build_tokenizer(spec.tokenizer, spec.config["vocab_size"])
    for fname, text in ft.hf_tokenizer_files(tok, spec.tokenizer, spec.config["max_position_embeddings"]).items():
        (hf_dir / fname).write_text(text, encoding="utf-8")
    gen = {"bos_token_id": spec.config["bos_token_id"], "eos_token_id": spec.config["eos_token_id"]}
    (hf_dir / "generation_config.json").write_text(json.dumps(gen))
    return hf_dir


def arch_fixture_dir(name: str, root: Path, spec: ArchFixture | None = None) -> Path:
    """Write the fixture's HF directory once under root and reuse it (llama.cpp's GGUF of it:
    llama_cpp_convert.llama_cpp_gguf); `spec` for a fixture outside ARCH_FIXTURES (arch_variants.py)."""
    final = Path(root) / f"{name}-v{ARCH_FIXTURE_VERSION}"
    return write_once(final, lambda tmp: write_hf(name, tmp, spec), name) / "hf"
