"""The structured-output bitmask in one Triton kernel against llguidance's own numpy apply (a
reference we did not write): on the CPU interpreter without CUDA, on the GPU (`gpu`) with it;
masks narrower and wider than the vocabulary, rows with every bit clear or set."""
from __future__ import annotations

import llguidance.numpy as llg_np
import numpy as np
import pytest
import torch
from triton_grid import DEVICES  # first: it picks the interpreter before a kernel module loads

from mlxr.ops.sampling.bitmask_triton import apply_token_bitmask_triton  # noqa: E402


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


@pytest.mark.gpu
def test_one_compiled_variant_serves_every_shape_and_alignment():
    """Row counts, vocabularies, mask widths and views at odd offsets: one compile in all, so a
    constrained step never compiles while serving (the warm-up compiles it)."""
    from mlxr.ops.sampling.bitmask_triton import _bitmask_kernel

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    before = sum(len(c[0]) for c in _bitmask_kernel.device_caches.values())
    for rows, vocab, words, offset in [(1, 49152, 1536, 0), (64, 49152, 1536, 0), (3, 1500, 47, 1), (7, 97, 5, 3)]:
        logits = torch.randn(rows * vocab + offset, device="cuda")[offset:].view(rows, vocab)
        mask = torch.full((rows * words + offset,), -1, dtype=torch.int32, device="cuda")[offset:].view(rows, words)
        apply_token_bitmask_triton(logits, mask)
    assert sum(len(c[0]) for c in _bitmask_kernel.device_caches.values()) - before <= 1
