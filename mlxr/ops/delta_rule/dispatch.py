"""The delta rule's and causal convolution's dispatchers, in the shapes the layer holds: q and k with
the key heads (Hk), v, g and beta with the value heads (Hv, a multiple of Hk: value head h reads
key head h // (Hv // Hk)), and the states in place, a decode step's in the engine's pools at its
rows' slots.

CPU tensors take the C kernels (delta_rule.c), CUDA tensors the Triton kernels, anything else or
what a kernel does not take the torch references (delta_rule.py). `MLXR_KERNELS=reference` (read
per call, for A/B checks) runs the references everywhere.
"""
from __future__ import annotations

import os

import torch

from mlxr.ops.backend import use_triton
from mlxr.ops.delta_rule import delta_rule_cpu
from mlxr.ops.delta_rule.delta_rule import causal_conv, causal_conv_step, delta_rule_chunked, delta_rule_step


def _reference_only() -> bool:
    return os.environ.get("MLXR_KERNELS", "auto") == "reference"


def _cpu_kernels(*tensors: torch.Tensor) -> bool:
    return all(t.is_cpu for t in tensors) and not _reference_only()


def _value_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def _carried(states: torch.Tensor, seq_lens: torch.Tensor | None) -> torch.Tensor:
    """The rows' states, zeros for a row at its first token (a tensor op: no read on the host)."""
    if seq_lens is None:
        return states
    return states * (seq_lens > 1).to(states.dtype).view(-1, *[1] * (states.dim() - 1))


def gated_delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     pool: torch.Tensor, slots: torch.Tensor, seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """One token of B rows: q, k [B, Hk, Dk], v [B, Hv, Dv], g, beta [B, Hv]; pool [slots, Hv, Dk, Dv]
    fp32, row b's state pool[slots[b]] advanced in place, from zeros where seq_lens[b] is 1 (the
    row's first token). Returns o [B, Hv, Dv] fp32."""
    done = None
    if _cpu_kernels(q, pool):
        done = delta_rule_cpu.delta_step_cpu(q, k, v, g, beta, pool, slots, seq_lens)
    elif use_triton(q, k, v, pool):
        from mlxr.ops.delta_rule.delta_rule_triton import delta_step_triton

        done = delta_step_triton(q, k, v, g, beta, pool, slots, seq_lens)
    if done is not None:
        return done
    heads = v.shape[1]
    o, state = delta_rule_step(_value_heads(q, heads), _value_heads(k, heads), v, g, beta,
                               _carried(pool.index_select(0, slots), seq_lens))
    pool.index_copy_(0, slots, state)
    return o


def gated_delta_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                        state: torch.Tensor) -> torch.Tensor:
    """One sequence of T tokens: q, k [T, Hk, Dk], v [T, Hv, Dv], g, beta [T, Hv]; state [Hv, Dk, Dv]
    fp32, advanced in place. Returns o [T, Hv, Dv] fp32."""
    done = None
    if _cpu_kernels(q, state):
        done = delta_rule_cpu.delta_chunked_cpu(q, k, v, g, beta, state)
    elif use_triton(q, k, v, state):
        from mlxr.ops.delta_rule.delta_rule_triton import delta_chunked_triton

        done = delta_chunked_triton(q, k, v, g, beta, state)
    if done is not None:
        return done
    heads = v.shape[1]
    o, new = delta_rule_chunked(_value_heads(q, heads), _value_heads(k, heads), v, g, beta, state)
    state.copy_(new)
    return o


def conv_prefill(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """SiLU(causal depthwise conv) of one sequence x [T, C]; state [C, K - 1] replaced in place by the
    last K - 1 inputs. Returns [T, C] in x's dtype."""
    if _cpu_kernels(x, state):
        done = delta_rule_cpu.causal_conv_cpu(x, state, weight)
        if done is not None:
            return done
    out, new = causal_conv(x, state, weight)
    state.copy_(new)
    return out


def conv_step(x: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor, weight: torch.Tensor,
              seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """One token of B rows x [B, C]; row b's state pool[slots[b]] [C, K - 1] shifted in place (zeros
    before it where seq_lens[b] is 1)."""
    if _cpu_kernels(x, pool):
        done = delta_rule_cpu.causal_conv_step_cpu(x, pool, slots, weight, seq_lens)
        if done is not None:
            return done
    out, new = causal_conv_step(x, _carried(pool.index_select(0, slots), seq_lens), weight)
    pool.index_copy_(0, slots, new.to(pool.dtype))
    return out
