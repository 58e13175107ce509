"""The sampling ops on their own (mlxr/ops/sampling/sampling.py) against their definitions."""
from __future__ import annotations

import pytest
import torch

NEG_INF = float("-inf")


def _nucleus_by_full_sort(logits: torch.Tensor, top_p: list[float]) -> torch.Tensor:
    """The definition: sort each row, keep the fewest most likely tokens whose mass reaches top_p."""
    probs = logits.softmax(dim=-1).double()
    keep = torch.zeros_like(logits, dtype=torch.bool)
    for r, p in enumerate(top_p):
        values, order = probs[r].sort(descending=True)
        before = values.cumsum(0) - values
        keep[r, order[(before < p) | (torch.arange(len(values)) == 0)]] = True
    return keep


@pytest.mark.parametrize("scale", [0.5, 3.0, 12.0])  # flat (the nucleus is most of the vocabulary) to peaked
def test_top_p_on_the_cpu_keeps_the_nucleus_of_a_full_sort(scale) -> None:
    from mlxr.ops.sampling.sampling import NUCLEUS_FIRST, apply_top_k_top_p

    vocab = 40 * NUCLEUS_FIRST
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(int(scale * 10))) * scale
    top_p = [0.5, 0.9, 0.95, 0.999, 1e-9]
    got = apply_top_k_top_p(logits, torch.full((5,), vocab), torch.tensor(top_p), vocab)
    assert torch.equal(got > NEG_INF, _nucleus_by_full_sort(logits, top_p))
    kept = got > NEG_INF
    assert torch.equal(got[kept], logits[kept])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sanitize_gives_a_new_float32_tensor_without_nan_or_inf(dtype) -> None:
    from mlxr.ops.sampling.sampling import sanitize

    logits = torch.tensor([[1.0, float("nan"), float("inf"), float("-inf")]], dtype=dtype)
    before = logits.clone()
    out = sanitize(logits)
    assert out.dtype == torch.float32 and out.data_ptr() != logits.data_ptr()
    assert out.tolist() == [[1.0, NEG_INF, torch.finfo(torch.float32).max, NEG_INF]]
    assert torch.equal(logits.isnan(), before.isnan()) and torch.equal(logits.nan_to_num(), before.nan_to_num())
