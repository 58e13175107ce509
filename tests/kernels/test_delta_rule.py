"""The gated delta rule's references (ops/delta_rule) against a float64 token-by-token loop of the
recurrence, and against transformers' own torch fallbacks for Qwen3.5 (a reference we did not write)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mlxr.ops.delta_rule.delta_rule import (causal_conv, causal_conv_step, delta_rule_chunked, delta_rule_step,
                                            l2_normalize)


def inputs(t: int, h: int = 3, dk: int = 8, dv: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(t, h, dk, generator=gen), torch.randn(t, h, dk, generator=gen)
    v = torch.randn(t, h, dv, generator=gen)
    g = -F.softplus(torch.randn(t, h, generator=gen))  # log decays <= 0
    beta = torch.rand(t, h, generator=gen)
    state = torch.randn(h, dk, dv, generator=gen) * 0.3
    return q, k, v, g, beta, state


def float64_loop(q, k, v, g, beta, state):
    """S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T, o_t = S_t^T q_t, per head, in float64."""
    q = l2_normalize(q.double()) * q.shape[-1] ** -0.5
    k = l2_normalize(k.double())
    s = state.double().clone()
    outs = []
    for t in range(q.shape[0]):
        for h in range(q.shape[1]):
            decayed = s[h] * torch.exp(g[t, h].double())
            write = beta[t, h].double() * (v[t, h].double() - decayed.T @ k[t, h])
            s[h] = decayed + torch.outer(k[t, h], write)
        outs.append(torch.einsum("hkv,hk->hv", s, q[t]))
    return torch.stack(outs), s


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("t,chunk", [(1, 64), (7, 64), (64, 64), (70, 64), (37, 8), (16, 1)])
def test_chunked_scan_matches_the_recurrence(t, chunk):
    q, k, v, g, beta, state = inputs(t, seed=t)
    want_o, want_s = float64_loop(q, k, v, g, beta, state)
    o, s = delta_rule_chunked(q, k, v, g, beta, state, chunk)
    assert rel(o, want_o) < 1e-5 and rel(s, want_s) < 1e-5


def test_one_step_update_matches_the_recurrence_for_each_sequence():
    rows = [inputs(1, seed=s) for s in range(4)]
    stack = [torch.stack([r[i][0] if i < 5 else r[i] for r in rows]) for i in range(6)]
    o, s = delta_rule_step(*stack)
    for b, r in enumerate(rows):
        want_o, want_s = float64_loop(*r)
        assert rel(o[b], want_o[0]) < 1e-6 and rel(s[b], want_s) < 1e-6


def test_prefill_then_steps_equal_one_prefill():
    q, k, v, g, beta, state = inputs(20, seed=3)
    o_all, s_all = delta_rule_chunked(q, k, v, g, beta, state)
    o, s = delta_rule_chunked(q[:12], k[:12], v[:12], g[:12], beta[:12], state)
    outs = [o]
    for t in range(12, 20):
        o_t, s = delta_rule_step(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], s[None])
        s = s[0]
        outs.append(o_t)
    assert rel(torch.cat(outs), o_all) < 1e-5 and rel(s, s_all) < 1e-5


def test_chunked_scan_matches_transformers_fallbacks():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    q, k, v, g, beta, state = inputs(70, seed=9)
    want_o, want_s = hf.torch_chunk_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None],
                                                     initial_state=state[None], output_final_state=True,
                                                     use_qk_l2norm_in_kernel=True)
    o, s = delta_rule_chunked(q, k, v, g, beta, state)
    assert rel(o, want_o[0]) < 1e-5 and rel(s, want_s[0]) < 1e-5
    step_o, step_s = hf.torch_recurrent_gated_delta_rule(q[None, :1], k[None, :1], v[None, :1], g[None, :1],
                                                         beta[None, :1], initial_state=state[None],
                                                         output_final_state=True, use_qk_l2norm_in_kernel=True)
    o, s = delta_rule_step(q[:1], k[:1], v[:1], g[:1], beta[:1], state[None])
    assert rel(o, step_o[0]) < 1e-6 and rel(s, step_s) < 1e-6


def test_causal_conv_carries_its_state_and_matches_transformers():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(11, 6, generator=gen), torch.randn(6, 4, generator=gen)
    want = hf.causal_conv1d_fn(x.t()[None], w, None, activation="silu")[0].t()
    out, state = causal_conv(x, torch.zeros(6, 3), w)
    assert rel(out, want) < 1e-6
    head, state = causal_conv(x[:5], torch.zeros(6, 3), w)
    rest = []
    for t in range(5, 11):
        o, state_b = causal_conv_step(x[t:t + 1], state[None], w)
        state = state_b[0]
        rest.append(o)
    assert rel(torch.cat([head, *rest]), want) < 1e-6
