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

from mlxr.ops.quant.block_types import QUANT_TYPES, quant_type  # noqa: E402
from mlxr.ops.quant.reference import dequantize, dequantize_rows, qmatmul_reference  # noqa: E402
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
import triton.language as tl  # noqa: E402
from mlxr.ops.quant.core_triton import (  # noqa: E402
    dequantize_triton,
    qgemv_triton,
    qmatmul_dequant_triton,
    qmatmul_fused_triton,
    qmatmul_triton,
)
from mlxr.ops.quant.wgemv_triton import wgemv_fits  # noqa: E402
from mlxr.ops.quant.wgemv_words_triton import _byte_val, _funnel  # noqa: E402


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
    if device == "cpu":  # the interpreter runs each program's unrolled word-stream code slowly
        return [(6, 512)]
    return [(300, 768), (2048, 2048)] if quant_type(qtype).block_elems == 256 else [(300, 96), (2048, 2048)]


def _qgemv_cases() -> list:
    """Every row count with every x dtype on the GPU. On the interpreter the row count picks the
    kernel (word-stream, FMA, dot) and the dtype matters only to the dot kernel (float32 x takes
    an IEEE dot): 1, 2 and 7 rows once each, the dtypes in turn, and 16 rows (dot) in every dtype."""
    cpu, gpu = DEVICES
    interpreted = [(1, torch.bfloat16), (2, torch.float16), (7, torch.float32)] + [(16, d) for d in X_DTYPES]
    return ([pytest.param("cpu", m, dtype, marks=cpu.marks) for m, dtype in interpreted]
            + [pytest.param("cuda", m, dtype, marks=gpu.marks) for m in (1, 2, 7, 16) for dtype in X_DTYPES])


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize(("device", "m", "dtype"), _qgemv_cases())
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
    """Split-K off and on, each kernel (word-stream, fma, dot), a 3-D x: the same result."""
    n, k = (6, 512) if device == "cpu" else (1000, 2048)
    raw = raw_tensor(qtype, n, k, device)
    x = rand_x(4, k, torch.float32, device).reshape(2, 2, k)
    ref = qmatmul_reference(x.cpu(), raw.cpu(), qtype, k)
    for cfg in ({"split": 1}, {"split": 3}, {"kind": "fma", "split": 1}, {"kind": "fma", "split": 3},
                {"kind": "dot", "split": 1}, {"kind": "dot"}):
        got = qgemv_triton(x, raw, qtype, k, config=cfg)
        assert got.shape == (2, 2, n)
        assert_close_scaled(got.cpu(), ref, torch.float32)
    a, b = qgemv_triton(x, raw, qtype, k), qgemv_triton(x, raw, qtype, k)
    assert torch.equal(a, b), "split-K sums in a fixed order"
    x3 = x.reshape(4, k)[:3]
    assert_close_scaled(qgemv_triton(x3, raw, qtype, k).cpu(), ref.reshape(4, n)[:3], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_triton_word_stream_gemv_steps(device, qtype, m):
    """The word-stream kernel over several K steps (the last one partial), whole and split-K, and
    the fallback for rows of an odd number of 2-byte aligned blocks (not whole words)."""
    n, k = (3, 2560) if device == "cpu" else (2050, 5632)
    raw = raw_tensor(qtype, n, k, device)
    if not wgemv_fits(raw, qtype, m):
        pytest.skip(f"the word-stream kernel is off for {qtype}")
    x = rand_x(m, k, torch.bfloat16, device)
    ref = qmatmul_reference(x.cpu(), raw.cpu(), qtype, k)
    for cfg in ({"split": 1}, {"split": 2}):
        assert_close_scaled(qgemv_triton(x, raw, qtype, k, config=cfg).cpu(), ref, torch.bfloat16)
    if qtype in ("Q4_K", "Q5_K") or device == "cpu":
        return
    k = 256 * 3 if qtype == "Q6_K" else 32 * 3
    raw = raw_tensor(qtype, 5, k, device)
    x = rand_x(m, k, torch.bfloat16, device)
    assert_close_scaled(qgemv_triton(x, raw, qtype, k).cpu(), qmatmul_reference(x.cpu(), raw.cpu(), qtype, k),
                        torch.bfloat16)


class _AsmResult:
    def __init__(self, handle):
        self.handle = handle

    def get_result(self, i):
        return self.handle


def _emulate_ptx(self, asm, constraints, values, types, is_pure, pack):
    """The interpreter's inline-asm hook for the two PTX instructions of the word-stream kernel,
    from their PTX ISA definitions. `prmt.b32 d, a, b, c`: byte i of d is byte (c >> 4i) & 7 of
    the 8 bytes {b, a} (a: bytes 0..3), or that byte's sign bit repeated when (c >> 4i) & 8.
    `shf.r.wrap.b32 d, a, b, c`: the low 32 bits of {b, a} >> (c & 31)."""
    from triton.runtime import interpreter

    op, operands = asm.strip().rstrip(";").split(None, 1)
    names = [o.strip() for o in operands.split(",")]
    assert constraints.startswith("=r,") and names[0] == "$0", (asm, constraints)

    def operand(name):
        if name.startswith("$"):
            return values[int(name[1:]) - 1].data.astype(np.uint64)
        return np.uint64(int(name, 0))

    a, b, c = (operand(o) for o in names[1:])
    pool = (b << np.uint64(32)) | a
    if op == "prmt.b32":
        d = np.zeros(np.broadcast_shapes(np.shape(a), np.shape(b), np.shape(c)), dtype=np.uint64)
        for i in range(4):
            sel = (c >> np.uint64(4 * i)) & np.uint64(15)
            byte = (pool >> (np.uint64(8) * (sel & np.uint64(7)))) & np.uint64(0xFF)
            sign = np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0))
            d = d | (np.where(sel & np.uint64(8), sign, byte) << np.uint64(8 * i))
    elif op == "shf.r.wrap.b32":
        d = (pool >> (c & np.uint64(31))) & np.uint64(0xFFFFFFFF)
    else:
        raise NotImplementedError(asm)
    return _AsmResult(interpreter.TensorHandle(d.astype(np.uint32), tl.uint32))


def _emulate_ptx_on(device: str, monkeypatch) -> None:
    """On the interpreter ("cpu"), inline PTX runs through _emulate_ptx."""
    if device == "cpu":
        from triton.runtime import interpreter

        monkeypatch.setattr(interpreter.InterpreterBuilder, "create_inline_asm", _emulate_ptx)


@triton.jit
def _ws_helpers_kernel(w_ptr, val_ptr, fun_ptr, QT: tl.constexpr, ASM: tl.constexpr):
    i = tl.arange(0, 256)
    lo = tl.load(w_ptr + i).to(tl.uint32, bitcast=True)  # the kernel's words are uint32
    hi = tl.load(w_ptr + (i + 1) % 256).to(tl.uint32, bitcast=True)
    for b in tl.static_range(4):
        tl.store(val_ptr + 256 * b + i, _byte_val(lo, b, QT, ASM))
    tl.store(fun_ptr + i, _funnel(lo, hi, 16, ASM))
    tl.store(fun_ptr + 256 + i, _funnel(lo, hi, (i & 1).to(tl.uint32) * 16, ASM))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("asm", [False, True])
@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_word_stream_helpers_bits(device, qtype, asm, monkeypatch):
    """_byte_val and _funnel, plain and PTX branches (emulated on the interpreter), on every byte
    value at every byte position: a prepared byte v reads as 0.5 + v / 256 (v < 128; Q8_0: the
    int8 v ^ 0x80), a funnel is the word at a 2-byte offset."""
    _emulate_ptx_on(device, monkeypatch)
    q8 = qtype == "Q8_0"
    j = np.arange(256, dtype=np.uint32)
    byte = [(j * 7 + 61 * b) % (256 if q8 else 128) for b in range(4)]  # each position takes each value
    words = byte[0] | (byte[1] << 8) | (byte[2] << 16) | (byte[3] << 24)
    w = torch.from_numpy(words.astype(np.uint32).view(np.int32).copy()).to(device)
    val = torch.empty(4, 256, dtype=torch.float32, device=device)
    fun = torch.empty(2, 256, dtype=torch.int32, device=device)
    _ws_helpers_kernel[(1,)](w, val, fun, QT=quant_type(qtype).code, ASM=asm)
    for b in range(4):
        want = (byte[b].astype(np.int32) ^ 0x80).astype(np.int8) if q8 else 0.5 + byte[b] / 256
        assert np.array_equal(val[b].cpu().numpy(), np.asarray(want, dtype=np.float32)), b
    hi = np.roll(words, -1).astype(np.uint64)
    wide = (hi << np.uint64(32)) | words.astype(np.uint64)
    want16 = ((wide >> np.uint64(16)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    got = fun.cpu().numpy().view(np.uint32)
    assert np.array_equal(got[0], want16)
    assert np.array_equal(got[1], np.where(j & 1, want16, words))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype", TYPES)
def test_word_stream_other_branches(device, qtype, monkeypatch):
    """The word-stream kernel's branches a device does not take by default: the inline-PTX ones on
    the interpreter (the instructions emulated), the plain ones compiled for the GPU."""
    _emulate_ptx_on(device, monkeypatch)
    n, k, m = (3, 2560, 2) if device == "cpu" else (300, 2560, 2)
    raw = raw_tensor(qtype, n, k, device)
    if not wgemv_fits(raw, qtype, m):
        pytest.skip(f"the word-stream kernel is off for {qtype}")
    x = rand_x(m, k, torch.float32, device)
    ref = qmatmul_reference(x.cpu(), raw.cpu(), qtype, k)
    cfg = {"asm": device == "cpu", "split": 2}
    assert_close_scaled(qgemv_triton(x, raw, qtype, k, config=cfg).cpu(), ref, torch.float32)


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
