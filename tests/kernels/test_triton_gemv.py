"""The Triton GEMV (16-bit weights, 1..4 rows) against an fp64 ground truth: on the CPU
interpreter without CUDA, on the GPU (`gpu`) with it; and the dense-linear dispatcher."""
from __future__ import annotations

import pytest
import torch
from triton_grid import DEVICES  # first: it picks the interpreter before a kernel module loads

from mlxr.ops.linear.gemv_triton import gemv_triton  # noqa: E402
from mlxr.ops.linear.linear import linear  # noqa: E402



def shapes(device: str) -> list[tuple[int, int, int, int]]:
    """(n, k, block_n, block_k): ragged n, k a multiple of block_k and not."""
    if device == "cpu":
        return [(10, 64, 4, 32), (7, 96, 2, 64), (3, 40, 4, 32)]
    return [(2560, 2048, 4, 512), (2048, 5632, 2, 512), (32000, 2048, 4, 1024), (1001, 1000, 8, 256)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_gemv_matches_fp64(device, dtype, m):
    g = torch.Generator().manual_seed(m)
    for n, k, bn, bk in shapes(device):
        x = torch.randn(m, k, generator=g).to(dtype)
        w = torch.randn(n, k, generator=g).to(dtype)
        want = x.double() @ w.double().T
        out = torch.full((m, n), float("nan"), dtype=dtype, device=device)  # poisoned
        got = gemv_triton(x.to(device), w.to(device), out, block_n=bn, block_k=bk)
        assert not got.isnan().any(), "unwritten output"
        err = (got.double().cpu() - want).abs().max() / want.abs().max()
        assert err < 1e-2, (n, k, err.item())  # one 16-bit rounding of the result


@pytest.mark.parametrize("device", DEVICES)
def test_linear_dispatcher_takes_the_gemv_for_one_row_only(device, monkeypatch):
    calls = []
    import mlxr.ops.linear.gemv_triton as mod

    real = mod.gemv_triton
    monkeypatch.setattr(mod, "gemv_triton", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    if device == "cpu":  # the dispatcher takes Triton only for CUDA tensors; call it as it would
        monkeypatch.setattr("mlxr.ops.linear.linear.use_triton", lambda *t: True)
    w = torch.randn(24, 64).bfloat16().to(device)
    b = torch.randn(24).bfloat16().to(device)
    x1, x3 = torch.randn(1, 64).bfloat16().to(device), torch.randn(3, 64).bfloat16().to(device)
    ref = torch.nn.functional.linear(x1.float(), w.float(), b.float())
    assert (linear(x1, w, b).float() - ref).abs().max() < 0.1 * ref.abs().max()
    linear(x3, w, b)
    linear(x1.float(), w.float())
    assert calls == [(1, 64)]
