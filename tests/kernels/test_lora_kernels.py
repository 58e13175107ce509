"""The gathered LoRA add (ops/lora) against an fp64 ground truth: the Triton kernels (on the CPU
interpreter without CUDA, `gpu` with it) and the torch path grouped by slot, over batches that
mix slots, the base (-1) and ranks that do not fill a slot's width."""
from __future__ import annotations

import pytest
import torch
from triton_grid import DEVICES  # first: it picks the interpreter before a kernel module loads

from mlxr.ops.lora.lora import lora_add_grouped, lora_add_reference  # noqa: E402
from mlxr.ops.lora.lora_triton import lora_add_triton  # noqa: E402


def _case(t: int, k: int, n: int, slots: int, r: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=g).to(dtype)
    a = torch.randn(slots, r, k, generator=g).to(dtype)
    b = torch.randn(slots, n, r, generator=g).to(dtype)
    token_slots = torch.randint(-1, slots, (t,), generator=g)
    y = torch.randn(t, n, generator=g).to(dtype)
    want = y.double().clone()
    for i, s in enumerate(token_slots.tolist()):
        if s >= 0:
            want[i] += b[s].double() @ (a[s].double() @ x[i].double())
    return x, a, b, token_slots, y, want


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double().cpu() - want).abs().max() / want.abs().max())


def shapes(device: str) -> list[tuple[int, int, int, int, int]]:
    """(tokens, in, out, slots, rank width): ragged sizes against the kernels' blocks."""
    if device == "cpu":
        return [(5, 40, 24, 3, 6), (1, 130, 70, 2, 16), (9, 64, 64, 4, 72)]
    return [(64, 2048, 6144, 4, 192), (1, 2048, 2048, 8, 64), (300, 4096, 1024, 2, 16)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_lora_add_matches_fp64(device, dtype):
    for i, (t, k, n, slots, r) in enumerate(shapes(device)):
        x, a, b, token_slots, y, want = _case(t, k, n, slots, r, dtype, i)
        got = lora_add_triton(y.to(device), x.to(device), a.to(device), b.to(device), token_slots.to(device))
        assert _err(got, want) < (1e-5 if dtype == torch.float32 else 2e-2), (t, k, n, slots, r)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_torch_path_matches_fp64_and_the_reference(dtype):
    for i, (t, k, n, slots, r) in enumerate(shapes("cpu")):
        x, a, b, token_slots, y, want = _case(t, k, n, slots, r, dtype, 10 + i)
        groups = [(s, (token_slots == s).nonzero().flatten(), r) for s in range(slots)]
        got = lora_add_grouped(y.clone(), x, a, b, groups)
        assert _err(got, want) < (1e-5 if dtype == torch.float32 else 2e-2)
        assert _err(lora_add_reference(y, x, a, b, token_slots), want) < (1e-5 if dtype == torch.float32 else 2e-2)


def test_grouped_path_reads_only_the_rank_in_use():
    """A slot's columns past its rank are never read: garbage there changes nothing."""
    x, a, b, token_slots, y, _ = _case(4, 32, 16, 1, 8, torch.float32, 3)
    token_slots.fill_(0)
    a2, b2 = a.clone(), b.clone()
    a2[0, 5:], b2[0, :, 5:] = float("nan"), float("nan")
    a[0, 5:], b[0, :, 5:] = 0, 0
    want = lora_add_grouped(y.clone(), x, a, b, [(0, None, 8)])
    got = lora_add_grouped(y.clone(), x, a2, b2, [(0, None, 5)])
    torch.testing.assert_close(got, want)
