"""MXFP4 blocks (gpt-oss's expert weights) kept 4-bit: dequantization bit-exact to gguf-py's,
the torch matmul and the Triton kernel (on the CPU interpreter without CUDA, `gpu` with it)
against x @ W^T of gguf-py's dequantized weight in float64."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

from gguf.constants import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402
from gguf.quants import quantize as gguf_quantize  # noqa: E402

from mlxr.ops.quant import mxfp4  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="interpreter")),
           pytest.param("cuda", marks=pytest.mark.gpu)]
MXFP4 = GGMLQuantizationType.MXFP4


def random_raw(n: int, k: int, seed: int) -> np.ndarray:
    """Random codes under exponents spread over the E8M0 range, subnormal scales (0, 1) included."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, k // 32, 17), dtype=np.uint8)
    raw[..., 0] = rng.integers(118, 136, size=(n, k // 32))
    raw[0, 0, 0], raw[0, -1, 0] = 0, 1
    return raw.reshape(n, k // 32 * 17)


def test_dequantize_is_bit_exact_to_gguf_py():
    raw = random_raw(9, 256, seed=1)
    want = gguf_dequantize(raw, MXFP4)
    got = mxfp4.dequantize(torch.from_numpy(raw), 256).numpy()
    assert got.shape == want.shape == (9, 256)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_dequantize_inverts_gguf_py_quantize_of_representable_weights():
    """gguf-py's quantizer of E2M1 values times a power of two gives those values back."""
    rng = np.random.default_rng(2)
    w = (rng.choice([-6, -3, -1.5, -0.5, 0, 0.5, 1, 2, 4, 6], size=(4, 64)) * 2.0 ** -3).astype(np.float32)
    w[:, ::32] = 6 * 2.0 ** -3  # every block's maximum is 6 x the scale
    raw = gguf_quantize(w, MXFP4)
    assert np.array_equal(mxfp4.dequantize(torch.from_numpy(raw), 64).numpy(), w)


def test_rows_of_the_wrong_size_are_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        mxfp4.row_bytes(48)
    with pytest.raises(ValueError, match="take 34 bytes"):
        mxfp4.dequantize(torch.zeros(2, 17, dtype=torch.uint8), 64)


def _reference(raw: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    return x.double() @ torch.from_numpy(gguf_dequantize(raw, MXFP4)).double().T


def test_torch_matmul_slices_rows_and_matches_the_dequantized_weight(monkeypatch):
    monkeypatch.setattr(mxfp4, "MXFP4_SLICE_ELEMS", 3 * 128)  # 3 rows a slice: 7 slices of 20 rows
    raw = random_raw(20, 128, seed=3)
    x = torch.randn(2, 5, 128, generator=torch.Generator().manual_seed(0))
    out = mxfp4.mxfp4_matmul(x, torch.from_numpy(raw), 128)
    ref = _reference(raw, x.reshape(-1, 128)).reshape(2, 5, 20)
    assert out.shape == (2, 5, 20) and out.dtype == torch.float32
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_triton_kernel_matches_the_dequantized_weight(device):
    from mlxr.ops.quant.mxfp4_triton import mxfp4_matmul_triton

    n, k = (40, 96) if device == "cpu" else (2880, 2880)  # gpt-oss-20b's expert shape on the GPU
    raw = random_raw(n, k, seed=4)
    w = torch.from_numpy(raw).to(device)
    for m in (1, 5, 33):  # a decode row, a short tile, two tiles of rows with a ragged end
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        out = mxfp4_matmul_triton(x.to(device), w, k).cpu()
        ref = _reference(raw, x)
        assert out.shape == (m, n)
        assert float((out.double() - ref).norm() / ref.norm()) < 1e-6, m
