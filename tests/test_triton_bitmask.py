"""The structured-output bitmask in one Triton kernel against llguidance's own numpy apply (a
reference we did not write): on the CPU interpreter without CUDA, on the GPU (`gpu`) with it;
masks narrower and wider than the vocabulary, rows with every bit clear or set."""
from __future__ import annotations

import llguidance.numpy as llg_np
import numpy as np
import pytest
import torch
from triton_grid import DEVICES  # first: it picks the interpreter before a kernel module loads

from mlxr.ops.bitmask_triton import apply_token_bitmask_triton  # noqa: E402


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows, vocab, words", [(3, 70, 3), (5, 100, 2), (64, 1500, 47)])
def test_matches_llguidance(device, rows, vocab, words):
    gen = torch.Generator().manual_seed(rows + vocab)
    logits = torch.randn(rows, vocab, generator=gen)
    mask = torch.randint(-(1 << 31), 1 << 31, (rows, words), dtype=torch.int64, generator=gen).to(torch.int32)
    mask[0] = 0
    mask[-1] = -1
    ref = logits.numpy().copy()
    llg_np.apply_token_bitmask_inplace(ref, mask.numpy())
    ours = logits.to(device)
    apply_token_bitmask_triton(ours, mask.to(device))
    assert np.array_equal(ours.cpu().numpy(), ref)
