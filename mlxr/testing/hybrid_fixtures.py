"""Tiny random hybrid (recurrent-state + attention) models, written by transformers' own classes
as arch_fixtures.py writes the others (kept apart so that each family's table stays its own)."""
from __future__ import annotations

from mlxr.testing.arch_fixtures import _BASE, ArchFixture

_QWEN35 = {**_BASE, "num_hidden_layers": 4, "layer_types": ["linear_attention", "linear_attention",
                                                            "linear_attention", "full_attention"],
           "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
           "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                               "mrope_section": [1, 1, 0]}}

# Three Gated DeltaNet layers then one gated full-attention layer; two value heads a key head
# (value heads as wide as key heads, as in the released models: llama.cpp requires it); RoPE on a
# quarter of each head, its multimodal sections shrunk to the two frequency pairs there are
# (text gives every section the same positions; llama.cpp checks they fit).
HYBRID_FIXTURES: dict[str, ArchFixture] = {
    "tiny-qwen35": ArchFixture({**_QWEN35, "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"]},
                               seed=30, gemma_norms=True),
    # Every layer's MLP a mixture: 8 experts, 2 a token (renormalised), and a shared expert
    # behind a sigmoid gate.
    "tiny-qwen35moe": ArchFixture({**_QWEN35, "model_type": "qwen3_5_moe_text",
                                   "architectures": ["Qwen3_5MoeForCausalLM"], "num_experts": 8,
                                   "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                   "shared_expert_intermediate_size": 48},
                                  seed=31, gemma_norms=True),
}


HYBRID_ARCHS = ("qwen35", "qwen35moe")  # the architectures these fixtures cover (tests/models/test_qwen35.py)
HYBRID_FIXTURE_VERSION = 3  # bump when the written files change


def hybrid_fixture_dir(name: str, root):
    from mlxr.testing.arch_fixtures import arch_fixture_dir

    return arch_fixture_dir(f"{name}-h{HYBRID_FIXTURE_VERSION}", root, HYBRID_FIXTURES[name])
