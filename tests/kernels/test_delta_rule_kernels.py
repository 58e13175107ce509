"""The delta rule's C kernels (CPU) and Triton kernels (interpreter on tiny shapes; gpu-marked at
the Qwen3.5 shapes) through the dispatcher (ops/delta_rule/dispatch.py), against the torch
references (themselves checked against a float64 loop and transformers in test_delta_rule.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mlxr.ops.delta_rule import delta_rule_cpu
from mlxr.ops.delta_rule.delta_rule import causal_conv, causal_conv_step, delta_rule_chunked, delta_rule_step
from mlxr.ops.delta_rule.dispatch import conv_prefill, conv_step, gated_delta_chunked, gated_delta_step


def inputs(t, hk, hv, dk, dv, seed=0, device="cpu", zero_state=False):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(t, hk, dk, generator=gen), torch.randn(t, hk, dk, generator=gen)
    v = torch.randn(t, hv, dv, generator=gen)
    g = -F.softplus(torch.randn(t, hv, generator=gen)) * 0.3
    beta = torch.rand(t, hv, generator=gen)
    state = torch.zeros(hv, dk, dv) if zero_state else torch.randn(hv, dk, dv, generator=gen) * 0.3
    return [x.to(device) for x in (q, k, v, g, beta, state)]


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def reference_chunked(q, k, v, g, beta, state):
    group = v.shape[1] // k.shape[1]
    return delta_rule_chunked(q.repeat_interleave(group, 1), k.repeat_interleave(group, 1), v, g, beta, state)


def reference_step(q, k, v, g, beta, states):
    group = v.shape[1] // k.shape[1]
    return delta_rule_step(q.repeat_interleave(group, 1), k.repeat_interleave(group, 1), v, g, beta, states)


@pytest.fixture
def c_kernels():
    if delta_rule_cpu._library() is None:
        pytest.skip("no C compiler")


CHUNKED_SHAPES = [(1, 2, 2, 16, 8), (63, 1, 3, 8, 8), (64, 2, 4, 32, 16), (130, 2, 2, 16, 24), (200, 4, 8, 64, 64)]


@pytest.mark.parametrize("zero_state", [False, True])
@pytest.mark.parametrize("t,hk,hv,dk,dv", CHUNKED_SHAPES)
def test_c_chunked_scan_matches_the_reference(c_kernels, t, hk, hv, dk, dv, zero_state):
    q, k, v, g, beta, state = inputs(t, hk, hv, dk, dv, seed=t, zero_state=zero_state)
    want_o, want_s = reference_chunked(q, k, v, g, beta, state)
    got_s = state.clone()
    got_o = delta_rule_cpu.delta_chunked_cpu(q, k, v, g, beta, got_s)
    assert got_o is not None
    assert rel(got_o, want_o) < 1e-5 and rel(got_s, want_s) < 1e-5


def test_c_chunked_scan_reads_split_views_of_the_convolution_output(c_kernels):
    q, k, v, g, beta, state = inputs(70, 2, 4, 16, 8, seed=5)
    mixed = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)
    qv, kv, vv = mixed.split([32, 32, 32], dim=1)
    got_s = state.clone()
    got_o = gated_delta_chunked(qv.view(70, 2, 16), kv.view(70, 2, 16), vv.view(70, 4, 8), g, beta, got_s)
    want_o, want_s = reference_chunked(q, k, v, g, beta, state)
    assert rel(got_o, want_o) < 1e-5 and rel(got_s, want_s) < 1e-5


@pytest.mark.parametrize("b,hk,hv,dk,dv", [(1, 1, 1, 8, 8), (3, 2, 4, 16, 24), (5, 4, 8, 128, 128)])
def test_c_step_updates_the_pool_slots_in_place(c_kernels, b, hk, hv, dk, dv):
    q, k, v, g, beta, _ = inputs(b, hk, hv, dk, dv, seed=b)
    pool = torch.randn(b + 3, hv, dk, dv, generator=torch.Generator().manual_seed(1)) * 0.3
    pool[1] = 0  # a fresh row's zero state
    slots = torch.randperm(b + 3, generator=torch.Generator().manual_seed(2))[:b]
    want_o, want_s = reference_step(q, k, v, g, beta, pool[slots])
    untouched = [i for i in range(b + 3) if i not in slots.tolist()]
    before = pool[untouched].clone()
    got_o = delta_rule_cpu.delta_step_cpu(q, k, v, g, beta, pool, slots)
    assert got_o is not None
    assert rel(got_o, want_o) < 1e-6 and rel(pool[slots], want_s) < 1e-6
    assert torch.equal(pool[untouched], before)


def test_c_prefill_then_steps_equal_one_reference_prefill(c_kernels):
    q, k, v, g, beta, state = inputs(90, 2, 4, 32, 16, seed=7)
    want_o, want_s = reference_chunked(q, k, v, g, beta, state)
    pool = torch.zeros(2, 4, 32, 16)
    pool[1] = state
    outs = [gated_delta_chunked(q[:67], k[:67], v[:67], g[:67], beta[:67], pool[1])]
    slots = torch.tensor([1])
    for t in range(67, 90):
        outs.append(gated_delta_step(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], pool, slots))
    assert rel(torch.cat(outs), want_o) < 1e-5 and rel(pool[1], want_s) < 1e-5


@pytest.mark.parametrize("t,width", [(1, 4), (11, 4), (70, 4), (9, 2)])
def test_c_causal_conv_matches_the_reference_and_carries_its_state(c_kernels, t, width):
    gen = torch.Generator().manual_seed(t)
    x, w = torch.randn(t, 12, generator=gen), torch.randn(12, width, generator=gen)
    state = torch.randn(12, width - 1, generator=gen)
    want, want_state = causal_conv(x, state, w)
    got_state = state.clone()
    got = delta_rule_cpu.causal_conv_cpu(x, got_state, w)
    assert got is not None
    assert rel(got, want) < 1e-6 and torch.equal(got_state, want_state)
    pool = torch.randn(3, 12, width - 1, generator=gen)
    slots = torch.tensor([2, 0])
    xs = torch.randn(2, 12, generator=gen)
    want_step, want_pool = causal_conv_step(xs, pool[slots], w)
    got_step = conv_step(xs, pool, slots, w)
    assert rel(got_step, want_step) < 1e-6 and torch.equal(pool[slots], want_pool)


def test_reference_switch_runs_the_reference(monkeypatch, c_kernels):
    monkeypatch.setenv("MLXR_KERNELS", "reference")
    q, k, v, g, beta, state = inputs(20, 1, 2, 8, 8, seed=3)
    want_o, want_s = reference_chunked(q, k, v, g, beta, state)
    got_s = state.clone()
    assert torch.equal(gated_delta_chunked(q, k, v, g, beta, got_s), want_o) and torch.equal(got_s, want_s)
    x, w, cs = torch.randn(5, 4), torch.randn(4, 4), torch.zeros(4, 3)
    assert torch.equal(conv_prefill(x, cs.clone(), w), causal_conv(x, cs, w)[0])


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_a_row_at_its_first_token_starts_from_zeros_without_reading_its_slot(monkeypatch, kernels):
    """Decode rows of context length 1 (seq_lens on the device, as a CPU graph replays them) take a
    zero state whatever their slot holds; the C kernels never read it (NaN stays out), the
    reference multiplies it away (a finite garbage state)."""
    monkeypatch.setenv("MLXR_KERNELS", kernels)
    q, k, v, g, beta, _ = inputs(3, 2, 4, 16, 8, seed=11)
    garbage = float("nan") if kernels == "auto" else 7.0
    pool = torch.randn(3, 4, 16, 8, generator=torch.Generator().manual_seed(3))
    pool[0] = garbage
    slots, lens = torch.tensor([0, 1, 2]), torch.tensor([1, 9, 4])
    carried = pool.clone()
    carried[0] = 0
    want_o, want_s = reference_step(q, k, v, g, beta, carried)
    got_o = gated_delta_step(q, k, v, g, beta, pool, slots, lens)
    assert rel(got_o, want_o) < 1e-6 and rel(pool, want_s) < 1e-6
    conv = torch.randn(3, 12, 3, generator=torch.Generator().manual_seed(4))
    conv[0] = garbage
    x, w = torch.randn(3, 12), torch.randn(12, 4)
    carried = conv.clone()
    carried[0] = 0
    want_x, want_conv = causal_conv_step(x, carried, w)
    got_x = conv_step(x, conv, slots, w, lens)
    assert rel(got_x, want_x) < 1e-6 and torch.equal(conv, want_conv)
