"""RMSNorm, optionally fused with the residual add: torch reference and dispatcher.

Two flavours: Llama (`weight * norm(x).to(dtype)`) and Gemma (`norm(x) * (1 + weight)` in fp32,
then the cast). With a residual, the input is h = x + residual (in the activations' dtype),
and both norm(h) and h (the next residual) come back.
"""
from __future__ import annotations

import torch

from mlxr.ops.backend import use_triton
from mlxr.ops.norm import norm_cpu


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) over the last dim, in fp32."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool
) -> torch.Tensor:
    if gemma:
        return (rms_normalize(x, eps) * (1.0 + weight.float())).to(x.dtype)
    return weight * rms_normalize(x, eps).to(x.dtype)


def _triton_fits(x: torch.Tensor, weight: torch.Tensor, gemma: bool) -> bool:
    # The Llama flavour's result takes the promoted dtype; the kernel writes x's dtype only.
    same_dtype = gemma or weight.dtype == x.dtype
    return same_dtype and weight.dim() == 1 and x.shape[-1] <= 65536 and use_triton(x, weight)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    gemma: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """norm(x), or (norm(x + residual), x + residual) when a residual is given."""
    if x.is_cpu:  # first: a decode step runs ~100 norms, so the CPU path skips the CUDA checks
        done = None
        if norm_cpu.fits(x, weight, residual) and torch.is_inference_mode_enabled():
            done = norm_cpu.rms_norm_cpu(x, weight, eps, gemma, residual)
        if done is not None:
            return done[0] if residual is None else done
    elif _triton_fits(x, weight, gemma) and (residual is None or residual.dtype == x.dtype):
        from mlxr.ops.norm.rms_norm_triton import rms_norm_triton

        out, new_residual = rms_norm_triton(x, weight, eps, gemma, residual)
        return out if residual is None else (out, new_residual)
    if residual is None:
        return rms_norm_reference(x, weight, eps, gemma)
    h = x + residual
    return rms_norm_reference(h, weight, eps, gemma), h
