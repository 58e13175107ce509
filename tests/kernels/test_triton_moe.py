"""The fused Triton MoE kernels against SparseMoE's grouped torch path: on the CPU
interpreter without CUDA, on the GPU (`gpu`) with it; the expert grouping on its own."""
from __future__ import annotations

import pytest
import torch
from triton_grid import DEVICES  # first: it picks the interpreter before a kernel module loads

from mlxr.layers.moe import SparseMoE  # noqa: E402
from mlxr.ops.moe.moe_triton import align_by_expert, fused_moe_silu  # noqa: E402
from paged_probe import rel_err  # noqa: E402


def test_alignment_groups_every_pair_once_in_blocks_of_one_expert():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [2, 3]])
    sorted_ids, block_expert = align_by_expert(ids, num_experts=5, block_m=4)
    flat, n = ids.reshape(-1), ids.numel()
    assert sorted(sorted_ids[sorted_ids < n].tolist()) == list(range(n))
    for b, e in enumerate(block_expert.tolist()):
        rows = sorted_ids[4 * b:4 * b + 4]
        rows = rows[rows < n]
        if e < 5:
            assert rows.numel() > 0 and (flat[rows] == e).all()
        else:
            assert rows.numel() == 0  # blocks past the last expert's run hold padding only
    # A size fixed by the pair count alone, so no host sync sizes it: N + E * (BM - 1) in whole blocks.
    assert sorted_ids.numel() == block_expert.numel() * 4 == 24


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("t", [1, 5, 37])
def test_fused_moe_matches_grouped_torch_path(device, t):
    torch.manual_seed(t)
    e, k, h, i = 6, 2, 48, 40  # dims not multiples of the blocks: masked edges
    moe = SparseMoE(h, i, e, k, "silu", norm_topk_prob=True)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(t, h)
    with torch.inference_mode():
        weights, ids = moe.route(x)
        want = moe._grouped(x, weights, ids)
        w = moe.experts
        got = fused_moe_silu(x.to(device), w.gate_proj.weight.to(device), w.up_proj.weight.to(device),
                             w.down_proj.weight.to(device), weights.to(device), ids.to(device))
    assert rel_err(got.cpu(), want) <= 1e-5
