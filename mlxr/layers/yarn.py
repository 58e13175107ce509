"""YaRN RoPE frequencies (Peng et al. 2023, "YaRN: Efficient Context Window Extension"), as
gpt-oss (theta 150000, factor 32 over an original 4096 positions, beta_fast 32, beta_slow 1, the
correction range not truncated) and Qwen's long-context configs use them.

Each frequency blends the original (extrapolated) one with the one divided by `factor`
(interpolated): frequencies that turn more than beta_fast times over the original context keep
theirs, those turning fewer than beta_slow times take the divided one, with a linear ramp over
the dimensions in between. cos/sin are then multiplied by the attention factor,
0.1 * ln(factor) + 1 unless the config names one."""
from __future__ import annotations

import math

import torch


def _correction_dim(rotations: float, head_dim: int, theta: float, original_max: int) -> float:
    """The dimension index whose frequency turns `rotations` times over original_max positions."""
    return head_dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def yarn_attention_factor(factor: float, attention_factor: float | None = None) -> float:
    if attention_factor is not None:
        return attention_factor
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def yarn_inv_freq(head_dim: int, theta: float, factor: float, original_max: int, beta_fast: float = 32.0,
                  beta_slow: float = 1.0, truncate: bool = True) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies."""
    low = _correction_dim(beta_fast, head_dim, theta, original_max)
    high = _correction_dim(beta_slow, head_dim, theta, original_max)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a ramp of one step, not a division by zero
    base = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # the share of the original frequency
    return (1.0 / (factor * base)) * (1 - keep) + (1.0 / base) * keep
