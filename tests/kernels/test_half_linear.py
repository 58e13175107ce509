"""The CPU kernel for float16 weights against a few float32 rows (mlxr/ops/half_linear): sums in
float32 against a float64 reference, each row's result independent of the rows beside it (a
speculative step's verifying rows compute exactly what one-row steps do), and StoredLinear
running it for decode-sized steps."""
from __future__ import annotations

import pytest
import torch

from mlxr.layers import linear as linear_layer
from mlxr.layers.linear import StoredLinear
from mlxr.ops.half_linear import half_linear_cpu as hl

NATIVE = hl.library()
if NATIVE is None:
    pytest.skip("no C compiler for the CPU kernels", allow_module_level=True)
SIMD = bool(NATIVE.mlxr_half_linear_simd())
BUILDS = ["native", pytest.param("x86-64", id="plain-c")]
# k: a multiple of 64, a 16-wide tail, a scalar tail, shorter than one vector.
SHAPES = [(96, 576), (40, 100), (33, 64 * 3 + 16 * 2 + 5), (8, 7)]


def weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.05).half()
    return w, torch.randn(13, k, generator=g)


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_float32_sums_match_float64(build: str, n: int, k: int) -> None:
    lib = hl.library(None if build == "native" else build)
    w, x = weights(n, k)
    for m in (1, 5, 13):
        y = hl.run(lib, x[:m], w)
        ref = x[:m].double() @ w.double().T
        assert y.dtype == torch.float32 and y.shape == (m, n)
        assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_each_row_is_what_a_one_row_call_gives(build: str, n: int, k: int) -> None:
    lib = hl.library(None if build == "native" else build)
    w, x = weights(n, k, seed=1)
    alone = torch.cat([hl.run(lib, x[i:i + 1], w) for i in range(len(x))])
    for m in range(1, len(x) + 1):
        assert torch.equal(hl.run(lib, x[:m], w), alone[:m]), m


def test_plain_c_agrees_with_native() -> None:
    w, x = weights(96, 576, seed=2)
    plain = hl.run(hl.library("x86-64"), x, w)
    torch.testing.assert_close(plain, hl.run(NATIVE, x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not SIMD, reason="the kernel runs in StoredLinear only from an AVX-512 build")
@pytest.mark.parametrize("rows", [1, 5, 9, linear_layer.GEMV_MAX_ROWS])
def test_stored_linear_sums_decode_rows_in_float32(rows: int) -> None:
    """torch's float16 product rounds each output to float16 (~5e-4 relative); decode-sized
    steps now keep float32 sums, and a 3-D input (batch, tokens, features) works as 2-D."""
    w, _ = weights(200, 576, seed=3)
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(4))
    bias = torch.randn(200)
    layer = StoredLinear(w, bias)
    y = layer(x.view(1, rows, 576))
    ref = x.double() @ w.double().T + bias.double()
    assert y.shape == (1, rows, 200) and y.dtype == torch.float32
    assert ((y[0].double() - ref).abs().max() / ref.abs().max()).item() < 1e-5
    assert torch.equal(y[0], hl.run(NATIVE, x, w) + bias)


def test_more_rows_than_decode_take_the_upcast_path() -> None:
    w, _ = weights(64, 128, seed=5)
    x = torch.randn(linear_layer.GEMV_MAX_ROWS + 1, 128, generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(StoredLinear(w, None)(x), x @ w.float().T)


def test_without_a_compiler_stored_linear_falls_back_to_torch(monkeypatch, tmp_path) -> None:
    from mlxr.ops.cpu import cpu_build as build

    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("MLXR_CACHE_DIR", str(tmp_path))
    build.load_library.cache_clear()
    try:
        assert hl.library() is None
        w, x = weights(64, 576, seed=7)
        torch.testing.assert_close(StoredLinear(w, None)(x[:5]), x[:5] @ w.float().T, rtol=2e-3, atol=2e-3)
    finally:
        build.load_library.cache_clear()
