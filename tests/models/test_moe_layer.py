"""SparseMoE (layers/moe.py) against transformers' own Qwen3-MoE block on the same weights, with
and without renormalised top-k weights; the sync-free path off the CPU equals the grouped one."""
from __future__ import annotations

import pytest
import torch

from mlxr.layers.moe import SparseMoE
from paged_probe import rel_err

E, K, H, I = 8, 2, 32, 16


def _pair(norm_topk_prob: bool):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K,
                         norm_topk_prob=norm_topk_prob)
    ref = Qwen3MoeSparseMoeBlock(cfg).eval()
    ours = SparseMoE(H, I, E, K, "silu", norm_topk_prob)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.5)
        ours.gate.weight.copy_(ref.gate.weight)
        gate, up = ref.experts.gate_up_proj.split(I, dim=1)  # [E, 2I, H]: gate rows first
        ours.experts.gate_proj.weight.copy_(gate)
        ours.experts.up_proj.weight.copy_(up)
        ours.experts.down_proj.weight.copy_(ref.experts.down_proj)
    return ref, ours


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_matches_transformers_qwen3_moe_block(norm_topk_prob):
    ref, ours = _pair(norm_topk_prob)
    x = torch.randn(40, H)
    with torch.inference_mode():
        want = ref(x[None])
        want = (want[0] if isinstance(want, tuple) else want)[0]
        got = ours(x)
    assert rel_err(got, want) <= 1e-5
    assert len(torch.unique(ours.route(x)[1])) == E  # every expert got tokens: all groups ran


def test_dense_path_equals_grouped_path():
    _, ours = _pair(True)
    x = torch.randn(17, H)
    with torch.inference_mode():
        weights, ids = ours.route(x)
        assert rel_err(ours._dense(x, weights, ids), ours._grouped(x, weights, ids)) <= 1e-6
