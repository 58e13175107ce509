"""The CPU RMSNorm kernel (mlxr/ops/norm/norm.c) against the torch reference, and its dispatch."""
from __future__ import annotations

import pytest
import torch

from mlxr.ops.norm import norm_cpu
from mlxr.ops.norm.rms_norm import rms_norm, rms_norm_reference

if norm_cpu._library() is None:
    pytest.skip("no C compiler for the CPU kernels", allow_module_level=True)


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("shape", [(1, 640), (7, 3, 256), (2, 2048)])
def test_kernel_matches_reference_with_and_without_residual(gemma, shape):
    g = torch.Generator().manual_seed(len(shape))
    x, res = torch.randn(*shape, generator=g) * 30, torch.randn(*shape, generator=g)
    w = torch.randn(shape[-1], generator=g)
    out, new_res = norm_cpu.rms_norm_cpu(x, w, 1e-6, gemma, None)
    assert new_res is None
    torch.testing.assert_close(out, rms_norm_reference(x, w, 1e-6, gemma), rtol=2e-6, atol=2e-6)
    out, new_res = norm_cpu.rms_norm_cpu(x, w, 1e-6, gemma, res)
    assert torch.equal(new_res, x + res)
    torch.testing.assert_close(out, rms_norm_reference(x + res, w, 1e-6, gemma), rtol=2e-6, atol=2e-6)


def test_dispatcher_takes_the_kernel_in_inference_mode_only(monkeypatch):
    calls = []
    real = norm_cpu.rms_norm_cpu
    monkeypatch.setattr(norm_cpu, "rms_norm_cpu", lambda *a: calls.append(1) or real(*a))
    x, w = torch.randn(2, 64), torch.randn(64)
    rms_norm(x, w, 1e-6)
    assert not calls  # autograd-capable torch ops outside inference mode
    with torch.inference_mode():
        rms_norm(x, w, 1e-6)
        rms_norm(x.half(), w.half(), 1e-6)  # not float32: the reference
    assert calls == [1]


def test_kernel_takes_strided_and_empty_inputs_in_their_shape():
    g = torch.Generator().manual_seed(3)
    x, res, w = torch.randn(4, 3, 64, generator=g).transpose(0, 1), torch.randn(3, 4, 64, generator=g), torch.randn(64)
    out, new_res = norm_cpu.rms_norm_cpu(x, w, 1e-6, True, res)
    assert out.shape == new_res.shape == (3, 4, 64) and out.is_contiguous()
    assert torch.equal(new_res, x + res)
    torch.testing.assert_close(out, rms_norm_reference(x + res, w, 1e-6, True), rtol=2e-6, atol=2e-6)
    assert norm_cpu.rms_norm_cpu(torch.empty(0, 2, 64), w, 1e-6, False, None)[0].shape == (0, 2, 64)
