"""act(gate) * up in Triton: one pass over gate and up, no intermediate in memory."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mlxr.ops.pdl_triton import pdl_launch, wait_for_inputs

BLOCK = 1024
KINDS = ("silu", "gelu_tanh")  # the activations the kernel computes (GELU: tanh approximation)


@triton.jit
def _gated_kernel(
    gate_ptr, up_ptr, out_ptr, n_cols, stride_g, stride_u, stride_o,
    GELU: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    g = tl.load(gate_ptr + row * stride_g + cols, mask=ok, other=0.0)
    u = tl.load(up_ptr + row * stride_u + cols, mask=ok, other=0.0)
    gf = g.to(tl.float32)
    if GELU:
        inner = 0.7978845608028654 * (gf + 0.044715 * gf * gf * gf)
        # tanh through exp: libdevice's tanh is not available under the interpreter; tanh is
        # +-1 in fp32 beyond |15|, and the clamp keeps exp finite.
        inner = tl.minimum(tl.maximum(inner, -15.0), 15.0)
        tanh = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
        a = 0.5 * gf * (1.0 + tanh)
    else:
        a = gf / (1.0 + tl.exp(-gf))
    # Round the activation to the dtype before the product, as the unfused ops do.
    y = a.to(g.dtype).to(tl.float32) * u.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def _rows(t: torch.Tensor) -> torch.Tensor:
    # Keeps views such as x[..., :I] of a fused projection as strided rows, without a copy.
    if t.dim() == 2 and t.stride(-1) == 1:
        return t
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def gated_activation_triton(
    gate: torch.Tensor, up: torch.Tensor, kind: str, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Launcher: gate and up [..., I] of one dtype, last dim contiguous (or copied so)."""
    assert kind in KINDS, f"unsupported activation {kind!r}"
    assert gate.shape == up.shape and gate.dtype == up.dtype
    assert gate.dtype in (torch.float32, torch.float16, torch.bfloat16)
    inter = gate.shape[-1]
    g2, u2 = _rows(gate), _rows(up)
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device) if out is None else out
    assert out.shape == gate.shape and out.dtype == gate.dtype and out.is_contiguous()
    o2 = out.view(-1, inter)
    if o2.shape[0] > 0 and inter > 0:
        _gated_kernel[(o2.shape[0], triton.cdiv(inter, BLOCK))](
            g2, u2, o2, inter, g2.stride(0), u2.stride(0), o2.stride(0),
            GELU=kind == "gelu_tanh", BLOCK=BLOCK, num_warps=4, **pdl_launch(gate.device),
        )
    return out
