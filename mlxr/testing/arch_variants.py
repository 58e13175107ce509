"""Variants of the architecture fixtures (arch_fixtures.py), one or more per registered
architecture, each exercising a setting the base fixture leaves at one value: tied embeddings,
head_dim other than hidden / heads, more or fewer experts picked, unnormalised top-k weights...
They check the GGUF that llama.cpp's converter writes against HF transformers on the same
checkpoint (tests/models/test_gguf_variants.py).

Some settings the converter does not write, and llama.cpp's runtime then runs the file with a
fixed rule: `gguf_runs_as` names the HF config under which transformers computes what the file
holds (llama.cpp's rule, read from its source, and checked against llama-server on the file).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mlxr.testing import fixture_tokenizer as ft
from mlxr.testing.arch_fixtures import _BASE, ARCH_FIXTURES, ArchFixture


@dataclass(frozen=True)
class Variant:
    arch: str  # the registered architecture (mlxr.models.ARCHITECTURES) it exercises
    fixture: ArchFixture
    # HF config changes giving the model llama.cpp runs from the converter's file ({}: the same).
    gguf_runs_as: dict = field(default_factory=dict)
    why: str = ""
    slow: bool = True


def _on(base: str, seed: int, **changes) -> ArchFixture:
    spec = ARCH_FIXTURES[base]
    config = {k: v for k, v in {**spec.config, **changes}.items() if v is not None}
    return ArchFixture(config, spec.tokenizer, seed, spec.gemma_norms)


_LLAMA = ArchFixture({**_BASE, "model_type": "llama", "architectures": ["LlamaForCausalLM"],
                      "bos_token_id": 1, "eos_token_id": 2}, tokenizer=ft.LLAMA, seed=30)
_QWEN2 = ArchFixture({**{k: v for k, v in _BASE.items() if k != "head_dim"}, "model_type": "qwen2",
                      "architectures": ["Qwen2ForCausalLM"], "rope_theta": 1000000.0}, seed=31)
# Gemma 3's own layout: five sliding layers, then a global one.
_GEMMA3 = ArchFixture({**_BASE, "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
                       "num_hidden_layers": 6, "sliding_window": 8, "query_pre_attn_scalar": 16,
                       "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
                       "bos_token_id": 2, "eos_token_id": 1}, tokenizer=ft.GEMMA, seed=32, gemma_norms=True)


def _gemma3(seed: int, **changes) -> ArchFixture:
    return ArchFixture({**_GEMMA3.config, **changes}, _GEMMA3.tokenizer, seed, True)

_YARN = ARCH_FIXTURES["tiny-gpt_oss"].config["rope_parameters"]

VARIANTS: dict[str, Variant] = {
    "gguf-llama-wide-heads": Variant("llama", ArchFixture({**_LLAMA.config, "head_dim": 32, "tie_word_embeddings": True},
                                                          _LLAMA.tokenizer, _LLAMA.seed),
                                     why="head_dim 32 with hidden 64 / 4 heads; tied embeddings"),
    "gguf-qwen2-tied": Variant("qwen2", ArchFixture({**_QWEN2.config, "tie_word_embeddings": True}, seed=_QWEN2.seed),
                               why="q/k/v biases, tied embeddings (Qwen2.5-0.5B's shape)"),
    "gguf-qwen3-wide-heads": Variant("qwen3", _on("tiny-qwen3", 33, head_dim=32, tie_word_embeddings=True),
                                     why="per-head q/k norms over head_dim 32 != hidden / heads; tied"),
    "gguf-mistral-wide-heads": Variant("mistral", _on("tiny-mistral", 34, head_dim=32, sliding_window=None),
                                       why="Mistral Nemo's head_dim 128 with hidden 5120 / 32 heads, scaled down"),
    "gguf-gemma2-wide-heads": Variant("gemma2", _on("tiny-gemma2", 35, head_dim=32, query_pre_attn_scalar=32),
                                      why="head_dim 32 with hidden 64 / 4 heads, softcaps and windows as the base"),
    # transformers' Gemma2Config default: 256; the file has no key for it.
    "gguf-gemma2-query-scale": Variant("gemma2", _on("tiny-gemma2", 36, query_pre_attn_scalar=256),
                                       gguf_runs_as={"query_pre_attn_scalar": 16}, slow=False,
                                       why="llama.cpp scales queries by head_dim ** -0.5 (hidden / heads at 46 "
                                           "layers): the converter writes no query_pre_attn_scalar"),
    "gguf-gemma2-untied": Variant("gemma2", _on("tiny-gemma2", 37, tie_word_embeddings=False),
                                  gguf_runs_as={"tie_word_embeddings": True},
                                  why="the converter drops lm_head.weight: llama.cpp's Gemma 2 always reads the "
                                      "embedding as the output"),
    "gguf-gemma3-query-scale": Variant("gemma3", _gemma3(44, query_pre_attn_scalar=256),
                                       gguf_runs_as={"query_pre_attn_scalar": 16},
                                       why="as Gemma 2: no key for query_pre_attn_scalar"),
    # The converter writes no sliding_window_pattern for Gemma 3: llama.cpp takes its 5:1 layout.
    "gguf-gemma3-alternating": Variant("gemma3", _gemma3(45, num_hidden_layers=4,
                                                         layer_types=["sliding_attention", "full_attention"] * 2),
                                       gguf_runs_as={"layer_types": ["sliding_attention"] * 4},
                                       why="layer types other than five sliding to one global: llama.cpp runs "
                                           "Gemma 3's pattern of 6 (four layers: all sliding)"),
    # transformers' Qwen3MoeConfig default: False; the file has no expert_weights_norm key.
    "gguf-qwen3moe-unnormalised": Variant("qwen3moe", _on("tiny-qwen3moe", 38, norm_topk_prob=False),
                                          gguf_runs_as={"norm_topk_prob": True}, slow=False,
                                          why="llama.cpp's Qwen3-MoE always renormalises the top-k weights: the "
                                              "converter writes no norm_topk_prob"),
    "gguf-qwen3moe-top4-of-16": Variant("qwen3moe", _on("tiny-qwen3moe", 39, num_experts=16, num_experts_per_tok=4,
                                                        head_dim=32),
                                        why="4 of 16 experts, head_dim 32"),
    "gguf-gpt_oss-top3-of-8": Variant("gpt_oss", _on("tiny-gpt_oss", 47, num_local_experts=8, num_experts_per_tok=3,
                                                      head_dim=32, num_hidden_layers=4, sliding_window=4),
                                      why="3 of 8 experts, head_dim 32, windows of 4 on layers 0 and 2"),
    # llama.cpp's gpt-oss runs the released SwiGLU constants (alpha 1.702, limit 7): no key for them.
    "gguf-gpt_oss-clamp": Variant("gpt_oss", _on("tiny-gpt_oss", 48, swiglu_limit=0.2),
                                  gguf_runs_as={"swiglu_limit": 7.0}, slow=False,
                                  why="a SwiGLU limit of 0.2: the converter writes none, llama.cpp clamps at 7"),
    "gguf-gpt_oss-untruncated-yarn": Variant(
        "gpt_oss", _on("tiny-gpt_oss", 49, rope_parameters={**_YARN, "truncate": False}),
        gguf_runs_as={"rope_parameters": {**_YARN, "truncate": True}}, slow=False,
        why="the released configs' YaRN leaves the correction range untruncated; the converter writes no flag "
            "and ggml's YaRN rounds the range outwards"),
    "gguf-mixtral-top3": Variant("mixtral", _on("tiny-mixtral", 40, num_local_experts=8, num_experts_per_tok=3),
                                 why="3 of 8 experts"),
    "gguf-granite-tied": Variant("granite", _on("tiny-granite", 41, tie_word_embeddings=True),
                                 why="tied embeddings under the logits scaling"),
    "gguf-olmo2-wide-heads": Variant("olmo2", _on("tiny-olmo2", 42, head_dim=None, num_key_value_heads=4),
                                     why="q/k norms over every head without GQA"),
    "gguf-phi3-gqa": Variant("phi3", _on("tiny-phi3", 43, num_key_value_heads=4, tie_word_embeddings=True),
                             why="fused qkv without GQA; tied embeddings"),
}

# Checkpoints MLXR refuses from either source, with an error that names the setting.
REFUSED: dict[str, tuple[ArchFixture, str]] = {
    # Phi-4-mini's shape: a quarter of each head unrotated (the GGUF: rope.dimension_count < head_dim).
    "refused-phi3-partial-rotary": (
        _on("tiny-phi3", 46, rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                              "long_factor": [1.0, 1.5, 2.0, 3.0], "short_factor": [1.0, 1.0, 1.1, 1.2]}),
        "partial[ _]rotary"),
}
