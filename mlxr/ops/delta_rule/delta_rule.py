"""The gated delta rule (Gated DeltaNet's linear attention) and its short causal convolution:
torch references, written from the recurrence.

Per head, with a matrix state S [Dk, Dv], each token t decays the state by a_t = exp(g_t) (g_t <= 0),
then writes the correction of what the decayed state predicts for its key, scaled by beta_t:

    S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T,    o_t = S_t^T q_t

`delta_rule_step` runs that for one token of many sequences (decode). `delta_rule_chunked` runs
a whole sequence chunk by chunk: inside a chunk the writes depend on each other only through a
unit lower-triangular system (solved at once), and the state is carried from chunk to chunk.
q and k are l2-normalised and q is scaled by Dk ** -0.5 here, as the models expect; everything
runs in fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prepare(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, k = l2_normalize(q.float()), l2_normalize(k.float())
    return q * q.shape[-1] ** -0.5, k


def delta_rule_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of B sequences: q, k [B, H, Dk], v [B, H, Dv], g, beta [B, H], state
    [B, H, Dk, Dv] (fp32). Returns (o [B, H, Dv] fp32, the new state)."""
    q, k = _prepare(q, k)
    decayed = state * g.float().exp()[..., None, None]
    predicted = torch.einsum("bhkv,bhk->bhv", decayed, k)
    write = (v.float() - predicted) * beta.float()[..., None]
    new = decayed + k[..., :, None] * write[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", new, q), new


def delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       state: torch.Tensor, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence of T tokens: q, k [T, H, Dk], v [T, H, Dv], g, beta [T, H], state
    [H, Dk, Dv] (fp32). Returns (o [T, H, Dv] fp32, the state after the last token)."""
    q, k = _prepare(q, k)
    v, g, beta = v.float(), g.float(), beta.float()
    outs = []
    for start in range(0, q.shape[0], chunk):
        end = start + chunk
        o, state = _chunk(q[start:end], k[start:end], v[start:end], g[start:end], beta[start:end], state)
        outs.append(o)
    return torch.cat(outs), state


def _chunk(q, k, v, g, beta, state):
    """A chunk of C tokens, heads first: with c the running sum of g, token j's write reaches
    token i >= j decayed by exp(c_i - c_j), and token i reads the entering state decayed by exp(c_i)."""
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))  # [H, C, D]
    c = g.transpose(0, 1).cumsum(-1)  # [H, C]
    b = beta.transpose(0, 1)[..., None]  # [H, C, 1]
    n = c.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    decay = (c[..., :, None] - c[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # [H, i, j]
    # The writes W [H, C, Dv]: W_i = b_i (v_i - exp(c_i) S0^T k_i - sum_{j<i} decay_ij (k_i.k_j) W_j)
    strict = (k @ k.transpose(-1, -2)) * decay * b
    system = torch.eye(n, device=q.device) + strict.tril(-1)
    rhs = b * (v - c.exp()[..., None] * (k @ state))
    writes = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    out = c.exp()[..., None] * (q @ state) + ((q @ k.transpose(-1, -2)) * decay) @ writes
    tail = (c[..., -1:] - c).exp()[..., None]  # [H, C, 1]: decay from each token to the chunk's end
    new = c[..., -1].exp()[..., None, None] * state + (k * tail).transpose(-1, -2) @ writes
    return out.transpose(0, 1), new


def causal_conv(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution of one sequence then SiLU: x [T, C], conv_state [C, K - 1]
    (the K - 1 inputs before x, oldest first), weight [C, K]. Returns (out [T, C] in x's dtype,
    the new state: the last K - 1 inputs)."""
    width = weight.shape[-1]
    full = torch.cat([conv_state.to(x.dtype), x.t()], dim=-1)  # [C, K - 1 + T]
    out = F.conv1d(full[None].to(weight.dtype), weight[:, None, :], groups=weight.shape[0])[0]
    return F.silu(out).t().to(x.dtype), full[:, full.shape[-1] - (width - 1):]


def causal_conv_step(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of B sequences: x [B, C], conv_state [B, C, K - 1], weight [C, K]."""
    full = torch.cat([conv_state.to(x.dtype), x[..., None]], dim=-1)  # [B, C, K]
    out = (full.to(weight.dtype) * weight).sum(-1)
    return F.silu(out).to(x.dtype), full[..., 1:]
