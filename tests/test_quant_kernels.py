"""GGUF block kernels: the torch reference against gguf-py (bit-exact), and the Triton
dequantizer, GEMV and GEMM against the reference, on the CPU interpreter without CUDA and on the
GPU (`gpu`) with it."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    # Must precede the first import of a kernel module: @triton.jit reads it then.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from mlxr.ops.quant_reference import dequantize, dequantize_rows, qmatmul_reference  # noqa: E402
from mlxr.ops.quant_types import QUANT_TYPES, quant_type  # noqa: E402
gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="interpreter grid")),
           pytest.param("cuda", marks=pytest.mark.gpu)]
TYPES = list(QUANT_TYPES)
X_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Relative to the largest |output|: float32 sums in another order; 16-bit outputs (and, on the
# tensor-core paths, the weight rounded to x's dtype) round once more. The interpreter truncates
# fp32 -> bf16 instead of rounding.
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2 if INTERPRETED else 1.6e-2}


# ---- test data -------------------------------------------------------------------------------


def _f16_bytes(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).view(np.uint8).reshape(*a.shape, 2)


def make_raw(qtype: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Valid blocks (n, row_bytes): quantized normal data where a quantizer exists, random bytes
    with sane fp16 scales elsewhere, and extreme blocks: d = 0, negative d, all codes max, all 0."""
    t = quant_type(qtype)
    rng = np.random.default_rng(seed)
    nb = k // t.block_elems
    raw = rng.integers(0, 256, size=(n, nb, t.block_bytes), dtype=np.uint8)
    sign = rng.choice(np.array([-1.0, 1.0]), size=(n, nb))
    d = rng.uniform(1e-3, 1e-2, size=(n, nb)) * sign
    d_at = 208 if qtype == "Q6_K" else 0
    raw[..., d_at:d_at + 2] = _f16_bytes(d)
    if qtype in ("Q4_K", "Q5_K"):
        raw[..., 2:4] = _f16_bytes(rng.uniform(1e-3, 1e-2, size=(n, nb)) * sign[:, ::-1])
    # Every other row from a real quantizer where there is one.
    data = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    from mlxr.quantize import kquants

    quantizer = {"Q4_K": kquants.quantize_q4_k, "Q6_K": kquants.quantize_q6_k}.get(qtype)
    if quantizer is None and qtype in ("Q4_0", "Q5_0", "Q8_0"):
        def quantizer(a):
            return gguf_quants.quantize(a, getattr(GGMLQuantizationType, qtype))
    if quantizer is not None:
        raw[::2] = quantizer(data[::2]).reshape(-1, nb, t.block_bytes)
    flat = raw.reshape(n * nb, t.block_bytes)
    scales = {"Q4_K": slice(4, 16), "Q5_K": slice(4, 16), "Q6_K": slice(192, 208)}.get(qtype)
    quants = {"Q4_0": slice(2, 18), "Q5_0": slice(2, 22), "Q8_0": slice(2, 34), "Q4_K": slice(16, 144),
              "Q5_K": slice(16, 176), "Q6_K": slice(0, 192)}[qtype]
    kind = np.arange(flat.shape[0]) % 5
    zero, top, bottom = kind == 1, kind == 2, kind == 3
    flat[zero, d_at:d_at + 2] = 0  # d = 0 (and dmin = 0)
    if qtype in ("Q4_K", "Q5_K"):
        flat[zero, 2:4] = 0
    flat[top, quants] = 0xFF  # max codes, negative d
    flat[top, d_at:d_at + 2] = _f16_bytes(np.array([-0.0078125]))[0]
    flat[bottom, quants] = 0  # min codes (Q6_K: scale -128)
    if scales is not None:
        flat[top, scales] = 0x7F if qtype == "Q6_K" else 0xFF
        flat[bottom, scales] = 0x80 if qtype == "Q6_K" else 0
    return flat.reshape(n, nb * t.block_bytes)


def gguf_dequantize(raw: np.ndarray, qtype: str) -> torch.Tensor:
    return torch.from_numpy(gguf_quants.dequantize(raw, getattr(GGMLQuantizationType, qtype)).copy())


def raw_tensor(qtype: str, n: int, k: int, device: str, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(make_raw(qtype, n, k, seed)).to(device)


def rand_x(m: int, k: int, dtype: torch.dtype, device: str, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(device, dtype)


def assert_close_scaled(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype and out.shape == ref.shape
    assert not out.isnan().any(), "unwritten (NaN) output"
    scale = ref.float().abs().max().item() or 1.0
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype] * scale, rtol=TOL[dtype])


def shapes_for(qtype: str) -> list[tuple[int, int]]:
    ks = [256, 512, 768] + ([32, 96] if quant_type(qtype).block_elems == 32 else [])
    return [(n, k) for n in (1, 3, 64) for k in ks]


# ---- reference -------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", TYPES)
def test_reference_is_bit_exact_to_gguf_py(qtype):
    for i, (n, k) in enumerate(shapes_for(qtype)):
        raw = make_raw(qtype, n, k, seed=i)
        got = dequantize(torch.from_numpy(raw), qtype, k)
        want = gguf_dequantize(raw, qtype)
        assert got.dtype == torch.float32 and got.shape == (n, k)
        assert torch.equal(got, want), (qtype, n, k, (got - want).abs().max().item())
        assert got.isfinite().all()
    assert torch.equal(dequantize(torch.from_numpy(raw), qtype, k, torch.bfloat16), want.to(torch.bfloat16))


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_rows_equals_slicing(qtype):
    raw = raw_tensor(qtype, 9, 512, "cpu")
    rows = torch.tensor([[2, 0, 8], [5, 5, 1]])
    got = dequantize_rows(raw, rows, qtype, 512)
    assert got.shape == (2, 3, 512)
    assert torch.equal(got, dequantize(raw, qtype, 512)[rows])
    assert torch.equal(dequantize_rows(raw, torch.tensor(4), qtype, 512), dequantize(raw, qtype, 512)[4])


def test_reference_matmul_is_fp32_product():
    raw = raw_tensor("Q4_K", 6, 256, "cpu")
    x = rand_x(3, 256, torch.bfloat16, "cpu")
    want = (x.float() @ dequantize(raw, "Q4_K", 256).T).to(torch.bfloat16)
    assert torch.equal(qmatmul_reference(x, raw, "Q4_K", 256), want)
    assert qmatmul_reference(x.reshape(1, 3, 256), raw, "Q4_K", 256).shape == (1, 3, 6)


# ---- Triton kernels --------------------------------------------------------------------------

triton = pytest.importorskip("triton")
from mlxr.ops.quant_triton import (  # noqa: E402
    dequantize_triton,
    qgemv_triton,
    qmatmul_dequant_triton,
    qmatmul_fused_triton,
    qmatmul_triton,
)


def _truncate_bf16(t: torch.Tensor) -> torch.Tensor:
    """What the interpreter's fp32 -> bf16 conversion does: drop the low 16 bits."""
    return (t.contiguous().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)


def _dequant_shapes(device: str, qtype: str) -> list[tuple[int, int]]:
    if device == "cpu":
        small = (5, 96) if quant_type(qtype).block_elems == 32 else (5, 512)
        return [(3, 256), small]
    ks = [32, 96, 256, 768] if quant_type(qtype).block_elems == 32 else [256, 768]
    return [(n, k) for n in (1, 33, 300) for k in ks] + [(4096, 4096), (2048, 5632)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype", TYPES)
def test_triton_dequantize_matches_reference(device, qtype):
    for i, (n, k) in enumerate(_dequant_shapes(device, qtype)):
        raw = raw_tensor(qtype, n, k, device, seed=i)
        ref = dequantize(raw.cpu(), qtype, k)
        out = torch.full((n, k), float("nan"), device=device)
        dequantize_triton(raw, qtype, k, torch.float32, out=out)
        assert torch.equal(out.cpu(), ref), (qtype, n, k, (out.cpu() - ref).abs().max().item())
        out16 = torch.full((n, k), float("nan"), device=device, dtype=torch.bfloat16)
        dequantize_triton(raw, qtype, k, torch.bfloat16, out=out16)
        want = _truncate_bf16(ref) if INTERPRETED else ref.to(torch.bfloat16)
        assert torch.equal(out16.cpu(), want), (qtype, n, k)
        if device == "cuda":
            assert torch.equal(dequantize_triton(raw, qtype, k, torch.float16).cpu(), ref.to(torch.float16))


def _gemv_shape(device: str, qtype: str) -> list[tuple[int, int]]:
    if device == "cpu":
        return [(40, 512)]
    return [(300, 768), (2048, 2048)] if quant_type(qtype).block_elems == 256 else [(300, 96), (2048, 2048)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 2, 7, 16])
@pytest.mark.parametrize("dtype", X_DTYPES)
def test_triton_qgemv_matches_reference(device, qtype, m, dtype):
    for i, (n, k) in enumerate(_gemv_shape(device, qtype)):
        raw = raw_tensor(qtype, n, k, device, seed=i)
        x = rand_x(m, k, dtype, device, seed=i + 1)
        ref = qmatmul_reference(x.cpu(), raw.cpu(), qtype, k)
        out = torch.full((m, n), float("nan"), device=device, dtype=dtype)
        qgemv_triton(x, raw, qtype, k, out=out)
        assert_close_scaled(out.cpu(), ref, dtype)
        out.fill_(float("nan"))
        assert qmatmul_triton(x, raw, qtype, k, out=out) is not None
        assert_close_scaled(out.cpu(), ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype", TYPES)
def test_triton_qgemv_launch_variants(device, qtype):
    """Split-K off and on, both kernels, a 3-D x: the same result."""
    n, k = (24, 512) if device == "cpu" else (1000, 2048)
    raw = raw_tensor(qtype, n, k, device)
    x = rand_x(4, k, torch.float32, device).reshape(2, 2, k)
    ref = qmatmul_reference(x.cpu(), raw.cpu(), qtype, k)
    for cfg in ({"split": 1}, {"split": 3}, {"kind": "dot", "split": 1}, {"kind": "dot"}):
        got = qgemv_triton(x, raw, qtype, k, config=cfg)
        assert got.shape == (2, 2, n)
        assert_close_scaled(got.cpu(), ref, torch.float32)
    a, b = qgemv_triton(x, raw, qtype, k), qgemv_triton(x, raw, qtype, k)
    assert torch.equal(a, b), "split-K sums in a fixed order"
    x3 = x.reshape(4, k)[:3]
    assert_close_scaled(qgemv_triton(x3, raw, qtype, k).cpu(), ref.reshape(4, n)[:3], torch.float32)


def _gemm_ms(device: str) -> list[int]:
    return [20] if device == "cpu" else [64, 300]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("dtype", X_DTYPES)
def test_triton_gemm_paths_match_reference(device, qtype, dtype):
    n, k = (40, 256) if device == "cpu" else (520, 1536)
    raw = raw_tensor(qtype, n, k, device)
    for m in _gemm_ms(device):
        x = rand_x(m, k, dtype, device, seed=m)
        ref = qmatmul_reference(x.cpu(), raw.cpu(), qtype, k)
        paths = [qmatmul_triton, qmatmul_dequant_triton]
        if dtype != torch.float32 or device == "cpu":
            paths.append(qmatmul_fused_triton)
        for fn in paths:
            out = torch.full((m, n), float("nan"), device=device, dtype=dtype)
            fn(x, raw, qtype, k, out=out)
            assert_close_scaled(out.cpu(), ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype", ["Q4_K"])
def test_triton_launchers_check_layouts(device, qtype):
    raw = raw_tensor(qtype, 4, 256, device)
    x = rand_x(1, 256, torch.float32, device)
    with pytest.raises(AssertionError):
        qgemv_triton(x, raw[:, :100], qtype, 256)  # row bytes do not match k
    with pytest.raises(AssertionError):
        qgemv_triton(x[:, :128], raw, qtype, 256)  # x's last dim is not k
    with pytest.raises(AssertionError):
        qgemv_triton(x.double(), raw, qtype, 256)
    with pytest.raises(AssertionError):
        qgemv_triton(rand_x(17, 256, torch.float32, device), raw, qtype, 256)
    with pytest.raises(AssertionError):
        dequantize_triton(raw.view(torch.int8), qtype, 256)
    with pytest.raises(AssertionError):
        dequantize_triton(raw.t().contiguous().t(), qtype, 256)
