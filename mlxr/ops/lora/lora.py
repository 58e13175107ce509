"""y += (x A[s]^T) B[s]^T for each token of a batch, s its adapter slot (-1: none).

The stacks hold every resident adapter of one layer: A [S, R, in], B [S, out, R] (the scaling
folded into B, a merged projection's parts block-diagonal along R). The torch path groups the
tokens by slot (the runner gives each slot's rows once a step) and runs two dense products a
slot; the Triton path gathers each token's matrices by its slot in two kernels (shrink to R,
expand to out), so a batch needs no host grouping and its launch shape does not depend on which
adapters it mixes."""
from __future__ import annotations

import torch

from mlxr.ops.backend import use_triton


def lora_add_reference(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       token_slots: torch.Tensor) -> torch.Tensor:
    """The readable definition, a token at a time (tests only)."""
    out = y.clone()
    for t, s in enumerate(token_slots.tolist()):
        if s >= 0:
            out[t] += (b[s].to(x.dtype) @ (a[s].to(x.dtype) @ x[t])).to(y.dtype)
    return out


def lora_add_grouped(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                     groups: list[tuple[int, torch.Tensor | None, int]]) -> torch.Tensor:
    """groups: (slot, its token rows or None for every row, its rank in use); y updated in place."""
    for slot, rows, rank in groups:
        if rank == 0:
            continue
        xa = x if rows is None else x.index_select(0, rows)
        delta = (xa @ a[slot, :rank].to(x.dtype).t()) @ b[slot, :, :rank].to(x.dtype).t()
        if rows is None:
            y += delta.to(y.dtype)
        else:  # (index_add_ on the CPU took 150 ms for 2 rows of 192 on a loaded host; this, 2 us)
            y.index_put_((rows,), delta.to(y.dtype), accumulate=True)
    return y


def lora_add(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, token_slots: torch.Tensor,
             groups: list[tuple[int, torch.Tensor | None, int]]) -> torch.Tensor:
    """y [T, out] += each token's low-rank delta, in place; x [T, in]."""
    assert x.dim() == 2 and y.shape == (x.shape[0], b.shape[1]) and a.shape[2] == x.shape[1], (x.shape, a.shape, b.shape)
    if use_triton(x, a, b, token_slots):
        from mlxr.ops.lora.lora_triton import lora_add_triton

        return lora_add_triton(y, x, a, b, token_slots)
    return lora_add_grouped(y, x, a, b, groups)
