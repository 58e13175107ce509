"""FP8 (E4M3) weights with one scale per output channel, multiplied by the GPU's FP8 tensor
cores (torch._scaled_mm, row-wise scales) with activations quantized per token on the fly.
A single row of 16-bit activations (decode at batch 1) goes through the Triton GEMV instead,
which reads the FP8 weights and keeps the activations unrounded: a matrix product for one row
cannot use the tensor cores, and quantizing the row plus _scaled_mm is ten launches a layer
where the GEMV is one (bench/gpu/gpu_quant.py: FP8 decode 344 tok/s before, bench/results/2026-11-24/README.md after).

The lm_head stays in the activation dtype, as vLLM's fp8 mode does: it is one matrix, and
its rounding shows directly in the sampled tokens.
"""
from __future__ import annotations

import torch
from torch import nn

from mlxr.layers.linear import StoredLinear
from mlxr.ops.backend import use_triton

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def quantize_rows_fp8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, k) -> E4M3 values and float32 scales (rows, 1), so t ~= values * scales."""
    scale = t.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
    return (t.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def fp8_supported(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


class FP8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        values, scale = quantize_rows_fp8(weight.detach())
        self.register_buffer("weight_fp8", values, persistent=False)
        self.register_buffer("weight_scale", scale.reshape(1, -1).contiguous(), persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16) and use_triton(x):
            from mlxr.ops.linear.gemv_triton import gemv_triton

            y = gemv_triton(rows, self.weight_fp8, scale=self.weight_scale).reshape(*x.shape[:-1], self.out_features)
            return y if self.bias is None else y + self.bias
        xq, x_scale = quantize_rows_fp8(rows)
        if rows.is_cuda:
            y = torch._scaled_mm(xq, self.weight_fp8.t(), scale_a=x_scale, scale_b=self.weight_scale,
                                 out_dtype=x.dtype if x.dtype != torch.float32 else torch.bfloat16)
        else:  # the same arithmetic in float32: the reference the GPU path is tested against
            y = (xq.float() * x_scale) @ (self.weight_fp8.float() * self.weight_scale.reshape(-1, 1)).t()
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, e4m3 per-channel"


def store_weights_fp8(model: nn.Module, check_device: bool = True) -> nn.Module:
    """Every linear layer inside the decoder layers -> FP8Linear (the lm_head is left alone)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name == "lm_head" or not isinstance(child, (nn.Linear, StoredLinear)):
                continue
            if check_device and not fp8_supported(child.weight.device):
                raise ValueError("--quantization fp8 needs an NVIDIA GPU with FP8 tensor cores "
                                 f"(compute capability 8.9+), not {child.weight.device}")
            setattr(module, name, FP8Linear(child.weight, child.bias))
    return model
