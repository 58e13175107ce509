"""The fused decode q/k/v projection + rotary + K/V cache write (Triton) against the unfused
torch reference (matmul, rotate-half rope, cache write): on the CPU interpreter without CUDA,
on the GPU (`gpu`) with it; outputs and cache poisoned so an unwritten element fails."""
from __future__ import annotations

import pytest
import torch
from triton_grid import DEVICES  # first: it picks the interpreter before a kernel module loads

from mlxr.ops.attention.paged_attention import write_kv  # noqa: E402
from mlxr.ops.rotary.qkv_rope_triton import qkv_rope_triton  # noqa: E402
from mlxr.ops.rotary.rotary import qkv_rope_write_kv, rotary_reference  # noqa: E402



def shapes(device: str) -> list[tuple[int, int, int, int]]:
    """(heads, kv heads, head_dim, hidden): GQA ratios 1, 4 and 8, hidden a multiple of the
    K step and not."""
    if device == "cpu":
        return [(4, 4, 16, 64), (8, 2, 16, 48), (8, 1, 32, 64)]
    return [(32, 4, 64, 2048), (16, 16, 128, 2048), (32, 4, 128, 3000), (8, 1, 256, 1152)]


def reference(x, w, bias, h, kh, pos, inv_freq, k_cache, v_cache, slots):
    d = 2 * inv_freq.shape[0]
    qkv = (x.double() @ w.double().T + (0 if bias is None else bias.double())).to(x.dtype)
    q, k, v = qkv.view(1, h + 2 * kh, d).split_with_sizes([h, kh, kh], 1)
    q, k = rotary_reference(q.float(), k.float(), pos, inv_freq)
    write_kv(k.to(x.dtype), v, k_cache, v_cache, slots)
    return q.to(x.dtype)


def _fused_cases() -> list:
    """The GPU runs every dtype with and without the bias; the interpreter (~10 s a case) one case
    per kernel path (the bias is a compile-time branch, the dtypes share the code): each path with
    a different dtype."""
    cpu, gpu = DEVICES
    grid = [(dtype, bias) for dtype in (torch.bfloat16, torch.float16) for bias in (False, True)]
    return ([pytest.param("cpu", *case, marks=cpu.marks) for case in ((torch.bfloat16, False), (torch.float16, True))]
            + [pytest.param("cuda", *case, marks=gpu.marks) for case in grid])


@pytest.mark.parametrize(("device", "dtype", "with_bias"), _fused_cases())
def test_fused_qkv_rope_matches_the_unfused_reference(device, dtype, with_bias):
    g = torch.Generator().manual_seed(int(with_bias))
    for h, kh, d, hidden in shapes(device):
        n = (h + 2 * kh) * d
        x = torch.randn(1, hidden, generator=g).to(dtype)
        w = (torch.randn(n, hidden, generator=g) / hidden**0.5).to(dtype)
        bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
        inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
        pos, slots = torch.tensor([37]), torch.tensor([2 * 16 + 5])
        caches = [torch.full((4, 16, kh, d), float("nan"), dtype=dtype) for _ in range(4)]
        want_q = reference(x, w, bias, h, kh, pos, inv_freq, caches[0], caches[1], slots)
        k_cache, v_cache = caches[2].to(device), caches[3].to(device)
        q_out = torch.full((1, h, d), float("nan"), dtype=dtype, device=device)
        got_q = qkv_rope_triton(x.to(device), w.to(device), None if bias is None else bias.to(device), h, kh,
                                pos.to(device), inv_freq.to(device), k_cache, v_cache, slots.to(device), q_out)
        tol = dict(atol=3e-2, rtol=2e-2)
        torch.testing.assert_close(got_q.cpu().float(), want_q.float(), **tol)
        torch.testing.assert_close(k_cache.cpu().float(), caches[0].float(), equal_nan=True, **tol)
        torch.testing.assert_close(v_cache.cpu().float(), caches[1].float(), equal_nan=True, **tol)


@pytest.mark.parametrize("device", DEVICES)
def test_a_padding_slot_writes_no_cache(device):
    h, kh, d, hidden = 4, 2, 16, 32
    x, w = torch.randn(1, hidden).half(), torch.randn((h + 2 * kh) * d, hidden).half()
    k_cache = torch.full((2, 16, kh, d), float("nan"), dtype=torch.half, device=device)
    v_cache = k_cache.clone()
    q = qkv_rope_triton(x.to(device), w.to(device), None, h, kh, torch.tensor([3], device=device),
                        torch.rand(d // 2, device=device), k_cache, v_cache, torch.tensor([-1], device=device))
    assert not q.isnan().any()
    assert k_cache.isnan().all() and v_cache.isnan().all()


def test_dispatcher_declines_what_the_kernel_does_not_take():
    """Two tokens, CPU tensors or an fp32 weight: None, so the layer takes the unfused path."""
    h, kh, d, hidden = 4, 2, 16, 32
    w = torch.randn((h + 2 * kh) * d, hidden)
    cache = torch.zeros(2, 16, kh, d)
    args = (h, kh, torch.tensor([0]), torch.rand(d // 2), cache, cache, torch.tensor([0]))
    assert qkv_rope_write_kv(torch.randn(1, hidden), w, None, *args) is None
    assert qkv_rope_write_kv(torch.randn(2, hidden).half(), w.half(), None, *args) is None
