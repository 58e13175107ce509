"""The delta rule's Triton kernels (ops/delta_rule/delta_rule_triton.py) against the torch references:
on the CPU interpreter at tiny shapes without CUDA, and on the GPU (`gpu`) at Qwen3.5's shapes
(head dim 128, 16 and 32 value heads) with it."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

from mlxr.ops.delta_rule.delta_rule import delta_rule_chunked, delta_rule_step  # noqa: E402
from mlxr.ops.delta_rule.delta_rule_triton import delta_chunked_triton, delta_step_triton  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CPU = pytest.mark.skipif(not INTERPRETED, reason="interpreter")


def inputs(t, hk, hv, dk, dv, seed, zero_state):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(t, hk, dk, generator=gen), torch.randn(t, hk, dk, generator=gen)
    v = torch.randn(t, hv, dv, generator=gen)
    g = -F.softplus(torch.randn(t, hv, generator=gen)) * 0.3
    beta = torch.rand(t, hv, generator=gen)
    state = torch.zeros(hv, dk, dv) if zero_state else torch.randn(hv, dk, dv, generator=gen) * 0.3
    return q, k, v, g, beta, state


def rel(a, b):
    return float((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm())


def grouped(x, heads):
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def check_chunked(t, hk, hv, dk, dv, chunk, device, zero_state, seed=0):
    q, k, v, g, beta, state = inputs(t, hk, hv, dk, dv, seed, zero_state)
    want_o, want_s = delta_rule_chunked(grouped(q, hv), grouped(k, hv), v, g, beta, state)
    got_s = state.to(device)
    got_o = delta_chunked_triton(*(x.to(device) for x in (q, k, v, g, beta)), got_s, chunk)
    assert got_o is not None
    assert rel(got_o, want_o) < 1e-5 and rel(got_s, want_s) < 1e-5


def check_step(b, hk, hv, dk, dv, device, seed=0):
    q, k, v, g, beta, _ = inputs(b, hk, hv, dk, dv, seed, False)
    pool = torch.randn(b + 2, hv, dk, dv, generator=torch.Generator().manual_seed(seed + 1)) * 0.3
    slots = torch.arange(b + 2).flip(0)[:b].contiguous()
    want_o, want_s = delta_rule_step(grouped(q, hv), grouped(k, hv), v, g, beta, pool[slots])
    got_pool = pool.to(device)
    got_o = delta_step_triton(*(x.to(device) for x in (q, k, v, g, beta)), got_pool, slots.to(device))
    assert got_o is not None
    assert rel(got_o, want_o) < 1e-5 and rel(got_pool.cpu()[slots], want_s) < 1e-5
    assert torch.equal(got_pool.cpu()[:2], pool[:2])  # slots 0 and 1 belong to no row


@CPU
@pytest.mark.parametrize("t,chunk,zero_state", [(5, 16, False), (37, 16, True), (40, 16, False)])
def test_interpreted_chunked_scan_matches_the_reference(t, chunk, zero_state):
    check_chunked(t, 1, 2, 16, 16, chunk, "cpu", zero_state, seed=t)


@CPU
def test_interpreted_chunked_scan_with_key_head_groups_and_a_partial_value_block():
    check_chunked(70, 2, 4, 32, 40, 64, "cpu", False, seed=70)  # two 64-token chunks, value blocks 32 + 8


@CPU
def test_interpreted_step_matches_the_reference():
    check_step(3, 1, 2, 16, 24, "cpu")


@CPU
def test_interpreted_step_starts_a_first_token_row_from_zeros():
    q, k, v, g, beta, _ = inputs(2, 1, 2, 16, 16, 5, False)
    pool = torch.randn(2, 2, 16, 16, generator=torch.Generator().manual_seed(6))
    want_o, want_s = delta_rule_step(grouped(q, 2), grouped(k, 2), v, g, beta,
                                     pool * torch.tensor([0.0, 1.0])[:, None, None, None])
    pool[0] = 5.0  # whatever the first-token row's slot held
    got_o = delta_step_triton(q, k, v, g, beta, pool, torch.tensor([0, 1]), torch.tensor([1, 3]))
    assert rel(got_o, want_o) < 1e-5 and rel(pool, want_s) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("hv", [16, 32])
@pytest.mark.parametrize("t,zero_state", [(1, True), (200, False), (2048, True)])
def test_gpu_chunked_scan_at_qwen35_shapes(t, hv, zero_state):
    check_chunked(t, 16, hv, 128, 128, 64, "cuda", zero_state, seed=t)


@pytest.mark.gpu
@pytest.mark.parametrize("hv", [16, 32])
def test_gpu_step_at_qwen35_shapes(hv):
    check_step(8, 16, hv, 128, 128, "cuda")
