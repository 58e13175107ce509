"""Triton RMSNorm(+residual), gated activation and rotary(+K/V cache write) against the
torch references: on the CPU interpreter without CUDA, on the GPU (`gpu`) with it."""
from __future__ import annotations

import pytest
import torch
from triton_grid import DEVICES, INTERPRETED  # first: it picks the interpreter before a kernel module loads

from mlxr.layers.mlp import GatedMLP  # noqa: E402
from mlxr.layers.norm import GemmaRMSNorm, RMSNorm  # noqa: E402
from mlxr.layers.rope import inverse_frequencies  # noqa: E402
from mlxr.ops.activation.activation import activation_reference, gated_activation  # noqa: E402
from mlxr.ops.activation.activation_triton import gated_activation_triton  # noqa: E402
from mlxr.ops.attention.paged_attention import write_kv  # noqa: E402
from mlxr.ops.norm.rms_norm import rms_norm, rms_norm_reference  # noqa: E402
from mlxr.ops.norm.rms_norm_triton import rms_norm_triton  # noqa: E402
from mlxr.ops.rotary.rotary import rotary_reference, rotary_write_kv  # noqa: E402
from mlxr.ops.rotary.rotary_triton import rotary_triton  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# The interpreter truncates fp32 -> bf16 (the GPU rounds to nearest): two roundings, 2 ulp.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 3e-2 if INTERPRETED else 1.6e-2}


def rand(*shape, dtype, device, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device, dtype)


def close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert not out.isnan().any(), "unwritten (NaN) output"
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("dim", [64, 200, 2048])
def test_rms_norm_with_and_without_residual(device, dtype, gemma, dim):
    x, res = rand(5, 3, dim, dtype=dtype, device=device), rand(5, 3, dim, dtype=dtype, device=device, seed=1)
    w = rand(dim, dtype=dtype, device=device, seed=2)
    out = torch.full_like(x, float("nan"))
    rms_norm_triton(x, w, 1e-6, gemma, out=out)
    close(out, rms_norm_reference(x, w, 1e-6, gemma), dtype)
    out.fill_(float("nan"))
    _, h = rms_norm_triton(x, w, 1e-6, gemma, res, out=out)
    # The same rounding as the unfused add; the interpreter truncates fp32 -> bf16 instead.
    exact = 0.0 if device == "cuda" or dtype != torch.bfloat16 else TOL[dtype]
    torch.testing.assert_close(h, x + res, atol=exact, rtol=exact)
    close(out, rms_norm_reference(x + res, w, 1e-6, gemma), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("inter", [64, 1500])
def test_gated_activation_split_and_concatenated(device, dtype, kind, inter):
    x = rand(7, 2 * inter, dtype=dtype, device=device) * 3
    gate, up = x[:, :inter], x[:, inter:]  # strided views, as a fused gate/up projection gives
    ref = activation_reference(gate, kind) * up
    for g, u in ((gate, up), (gate.contiguous(), up.contiguous())):
        out = torch.full_like(ref, float("nan"))
        close(gated_activation_triton(g, u, kind, out=out), ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim,heads", [(64, (4, 4)), (128, (8, 2)), (256, (8, 1))])
@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
def test_rotary_and_fused_cache_write(device, dtype, dim, heads, block_size):
    n_tok, n_blocks = 6, 8
    q = rand(n_tok, heads[0], dim, dtype=dtype, device=device)
    k, v = (rand(n_tok, heads[1], dim, dtype=dtype, device=device, seed=s) for s in (1, 2))
    pos = torch.tensor([0, 1, 7, 300, 4095, 9000], device=device)
    inv_freq = inverse_frequencies(dim, 10000.0, None).to(device)
    slots = torch.randperm(n_blocks * block_size, generator=torch.Generator().manual_seed(3))[:n_tok].to(device)
    caches = [torch.full((n_blocks, block_size, heads[1], dim), float("nan"), dtype=dtype, device=device)
              for _ in range(4)]
    want_q, want_k = rotary_reference(q, k, pos, inv_freq)
    write_kv(want_k, v, caches[0], caches[1], slots)
    outs = (torch.full_like(q, float("nan")), torch.full_like(k, float("nan")))
    got_q, got_k = rotary_triton(q, k, pos, inv_freq, (v, caches[2], caches[3], slots), out=outs)
    close(got_q, want_q, dtype)
    close(got_k, want_k, dtype)
    written = caches[0].isnan()
    assert torch.equal(written, caches[2].isnan()), "wrong cache slots written"
    close(caches[2].nan_to_num(), caches[0].nan_to_num(), dtype)
    assert torch.equal(caches[3].nan_to_num(), caches[1].nan_to_num()), "v is copied exactly"


def test_cpu_layers_keep_the_reference_numerics():
    x, res = rand(4, 32, dtype=torch.bfloat16, device="cpu"), rand(4, 32, dtype=torch.bfloat16, device="cpu")
    norm = GemmaRMSNorm(32).to(torch.bfloat16)
    assert torch.equal(norm(x), rms_norm_reference(x, norm.weight, norm.eps, True))
    out, h = RMSNorm(32).to(torch.bfloat16)(x, res)
    assert torch.equal(h, x + res) and torch.equal(out, rms_norm(x + res, torch.ones(32, dtype=torch.bfloat16), 1e-6))
    mlp = GatedMLP(32, 48, "gelu")
    y = mlp.gate_proj(x.float())
    assert torch.equal(gated_activation(y, y, "gelu_tanh"), torch.nn.functional.gelu(y, approximate="tanh") * y)


@pytest.mark.gpu
def test_gpu_dispatchers_pick_triton_and_honour_reference_switch(monkeypatch):
    q, k, v = (rand(5, 4, 64, dtype=torch.bfloat16, device="cuda", seed=s) for s in range(3))
    pos, inv = torch.arange(5, device="cuda") * 977, inverse_frequencies(64, 1e4, None).cuda()
    kc, vc = (torch.zeros(4, 4, 4, 64, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    fast = rotary_write_kv(q, k, v, pos, inv, kc, vc, torch.arange(5, device="cuda"))
    monkeypatch.setenv("MLXR_KERNELS", "reference")
    slow = rotary_write_kv(q, k, v, pos, inv, kc, vc, torch.arange(5, device="cuda"))
    assert not torch.equal(fast[0], slow[0])  # fp32 rotation vs bf16 products: different roundings
    close(fast[0], slow[0], torch.bfloat16)
