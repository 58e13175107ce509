"""The extra kept-quantized GGUF types (Q4_1, Q5_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS): the torch
reference and the C kernels against gguf-py's dequantizer, the matmul against float64, and a
model whose GGUF holds them loading them kept quantized."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from quant_blocks import random_blocks, reference_dequantize

from mlxr.ops.quant import cpu as quant_cpu
from mlxr.ops.quant import quant
from mlxr.ops.quant.block_types import CPU_INT_TYPES, EXTRA_TYPES
from mlxr.ops.quant.reference import dequantize

TYPES = list(EXTRA_TYPES)
MARCHES = ["native", "x86-64"]  # the host's vector build and the portable one


def _gguf(raw: np.ndarray, qtype: str, n: int, k: int) -> np.ndarray:
    return reference_dequantize(raw, qtype, n, k)  # gguf-py's, or bitsandbytes' rule for NF4


@pytest.mark.parametrize("qtype", TYPES)
def test_reference_is_bit_exact_to_gguf_py(qtype: str) -> None:
    n, k = 5, 512
    raw = random_blocks(qtype, n, k, seed=1)
    got = dequantize(torch.from_numpy(raw), qtype, k).numpy()
    assert np.array_equal(got.view(np.uint32), _gguf(raw, qtype, n, k).view(np.uint32))


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("qtype", TYPES)
def test_cpu_kernels_against_gguf_py(qtype: str, march: str) -> None:
    lib = quant_cpu.library(march, "quant_extra")
    assert lib is not None
    n, k = 24, 768
    raw = random_blocks(qtype, n, k, seed=2)
    want = _gguf(raw, qtype, n, k)
    t = torch.from_numpy(raw)
    got = quant_cpu.dequantize_cpu(t, qtype, k, lib).numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    for m in (1, 3, 9):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        ref = x.double() @ torch.from_numpy(want).double().T
        out = quant_cpu.qmatmul_cpu(x, t, qtype, k, lib)
        err = (out.double() - ref).norm() / ref.norm()
        assert err < 1e-5, (qtype, m, float(err))


@pytest.mark.parametrize("qtype", TYPES)
def test_dispatch_matmul_and_embedding_rows(qtype: str) -> None:
    n, k = 16, 512
    raw = random_blocks(qtype, n, k, seed=3)
    want = torch.from_numpy(_gguf(raw, qtype, n, k))
    t = torch.from_numpy(raw)
    # quant.c's integer kernel (Q4_1 on CPU) rounds activations to 16 bits per 32 columns.
    tol = 1e-4 if qtype in CPU_INT_TYPES else 1e-5
    for m in (1, 4, 20):  # the kernel's rows and the dequantize + GEMM rows
        x = torch.randn(2, m, k)
        got = quant.qmatmul(x, t, qtype, k)
        ref = (x.double() @ want.double().T)
        assert got.shape == (2, m, n) and (got.double() - ref).norm() / ref.norm() < tol
    rows = torch.tensor([[3, 0], [15, 3]])
    assert torch.equal(quant.dequantize_rows(t, rows, qtype, k), want[rows])


def test_cpu_auto_keeps_only_types_with_integer_kernels():
    """On CPU under "auto" the extra types without an integer kernel load expanded (their plain C
    kernels decoded the bundled SmolLM2 Q4_1 at 13 tok/s against 56 expanded, before quant.c took
    Q4_1); `gguf` keeps them, as CUDA does."""
    import torch

    from mlxr.loader import kept_types

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    auto = kept_types(cpu, "auto")
    assert {"Q4_1", "Q4_K"} <= set(auto) and not {"Q5_1", "Q2_K", "IQ4_XS"} & set(auto)
    assert {"Q4_1", "IQ4_XS", "Q2_K"} <= set(kept_types(cpu, "gguf")) & set(kept_types(cuda, "auto"))
