"""RMSNorm (+ residual add) in Triton: one program per row, the whole row in registers."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlxr.ops.pdl_triton import pdl_launch, wait_for_inputs


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, eps,
    stride_x, stride_r, stride_o, stride_nr, n_cols,
    BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, GEMMA: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=ok, other=0.0)
        # Round the sum to the activations' dtype first, as the unfused add would.
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(new_res_ptr + row * stride_nr + cols, x, mask=ok)
    xf = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    normed = xf * inv_rms
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if GEMMA:
        y = normed * (1.0 + w)
    else:
        # Llama casts the normalised row to the dtype before the weight multiplies it.
        y = normed.to(x.dtype).to(tl.float32) * w
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def _rows(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def rms_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    gemma: bool,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Launcher: (norm(h), h) with h = x + residual, or (norm(x), None)."""
    dim = x.shape[-1]
    assert weight.shape == (dim,) and weight.stride(0) == 1
    assert x.dtype in (torch.float32, torch.float16, torch.bfloat16)
    assert gemma or weight.dtype == x.dtype
    x2 = _rows(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    assert out.shape == x.shape and out.dtype == x.dtype and out.is_contiguous()
    out2 = out.view(-1, dim)
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype
        r2 = _rows(residual)
        new_res = torch.empty_like(out)
        nr2 = new_res.view(-1, dim)
    else:
        r2 = nr2 = x2  # unused: HAS_RESIDUAL is off
        new_res = None
    block = triton.next_power_of_2(dim)
    if x2.shape[0] > 0:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, r2, weight, out2, nr2, eps,
            x2.stride(0), r2.stride(0), out2.stride(0), nr2.stride(0), dim,
            BLOCK=block, HAS_RESIDUAL=residual is not None, GEMMA=gemma,
            num_warps=min(16, max(1, block // 256)), **pdl_launch(x.device),
        )
    return out, new_res
