"""The extra types' Triton kernels against gguf-py: on the CPU interpreter (tiny shapes) without
CUDA, and on the GPU (`gpu`) with it."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

from quant_blocks import random_blocks, reference_dequantize  # noqa: E402

from mlxr.ops.quant.quant_extra_triton import dequantize_extra_triton, qmatmul_extra_triton  # noqa: E402
from mlxr.ops.quant.quant_types import EXTRA_TYPES  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="interpreter")),
           pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype", list(EXTRA_TYPES))
def test_triton_dequantize_and_matmul_against_gguf_py(qtype: str, device: str) -> None:
    n, k = (20, 512) if device == "cpu" else (300, 4096)
    raw = random_blocks(qtype, n, k, seed=4)
    want = reference_dequantize(raw, qtype, n, k)
    t = torch.from_numpy(raw).to(device)
    got = dequantize_extra_triton(t, qtype, k).cpu().numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    w64 = torch.from_numpy(want).double()
    for m in (1, 3, 17):  # the GEMV kernel, then dequantize + matmul
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        ref = x.double() @ w64.T
        out = qmatmul_extra_triton(x.to(device), t, qtype, k).cpu().double()
        assert (out - ref).norm() / ref.norm() < 1e-5, (qtype, m)
        if device == "cuda":
            half = qmatmul_extra_triton(x.to(device, torch.bfloat16), t, qtype, k).cpu().double()
            assert (half - ref).norm() / ref.norm() < 2e-2
