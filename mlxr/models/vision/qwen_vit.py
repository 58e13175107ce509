"""Qwen2.5-VL's vision tower (transformers' Qwen2_5_VisionTransformerPretrainedModel), one image at
a time: flattened patches (the processor's order: 2 x 2 merge blocks row-major, each block's
patches row-major) through a bias-free Conv3d over temporal_patch_size frames, blocks of RMS
norm, 2D rotary attention (height then width positions, a quarter of the head each, twice) and
a gated MLP; attention is over windows of window_size pixels except in full_attention_layers.
The merger RMS-norms each patch and joins each 2 x 2 block through a two-layer MLP into one
text-width token. Parameter names are the checkpoint's below `visual.`."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mlxr.layers.norm import RMSNorm
from mlxr.model_config import VisionArgs


class PatchEmbed(nn.Module):
    def __init__(self, v: VisionArgs) -> None:
        super().__init__()
        kernel = (v.temporal_patch_size, v.patch_size, v.patch_size)
        self.kernel, self.channels = kernel, v.num_channels
        self.proj = nn.Conv3d(v.num_channels, v.hidden_size, kernel, stride=kernel, bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        x = patches.view(-1, self.channels, *self.kernel).to(self.proj.weight.dtype)
        return self.proj(x).flatten(1)


class VisionMLP(nn.Module):
    def __init__(self, v: VisionArgs) -> None:
        super().__init__()
        d, i = v.hidden_size, v.intermediate_size
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(d, i), nn.Linear(d, i), nn.Linear(i, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class VisionAttention(nn.Module):
    def __init__(self, v: VisionArgs) -> None:
        super().__init__()
        d = v.hidden_size
        self.heads, self.head_dim = v.num_attention_heads, d // v.num_attention_heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, self.head_dim).unbind(1)
        q = (q.float() * cos + _rotate_half(q.float()) * sin).to(x.dtype)
        k = (k.float() * cos + _rotate_half(k.float()) * sin).to(x.dtype)
        outs = []
        for qw, kw, vw in zip(q.split(lengths), k.split(lengths), v.split(lengths)):
            scores = torch.einsum("qhd,khd->hqk", qw, kw) * self.head_dim**-0.5
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(vw.dtype)
            outs.append(torch.einsum("hqk,khd->qhd", probs, vw))
        return self.proj(torch.cat(outs).reshape(n, -1))


class VisionBlock(nn.Module):
    def __init__(self, v: VisionArgs) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(v.hidden_size, 1e-6), RMSNorm(v.hidden_size, 1e-6)
        self.attn, self.mlp = VisionAttention(v), VisionMLP(v)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, lengths)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    def __init__(self, v: VisionArgs, text_hidden: int) -> None:
        super().__init__()
        self.width = v.hidden_size * v.scale_factor**2
        self.ln_q = RMSNorm(v.hidden_size, 1e-6)
        self.mlp = nn.Sequential(nn.Linear(self.width, self.width), nn.GELU(), nn.Linear(self.width, text_hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.width))


def flat_patches(image: torch.Tensor, patch: int, merge: int, temporal: int) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """[C, H, W] -> the processor's flat patches [h*w, C*temporal*p*p] (the still image repeated
    over the temporal patch) and grid (1, h, w)."""
    c, height, width = image.shape
    h, w = height // patch, width // patch
    x = image.reshape(c, h // merge, merge, patch, w // merge, merge, patch).permute(1, 4, 2, 5, 0, 3, 6)
    x = x[:, :, :, :, :, None].expand(*x.shape[:5], temporal, patch, patch)
    return x.reshape(h * w, -1), (1, h, w)


def block_major_positions(h: int, w: int, merge: int) -> torch.Tensor:
    """[h*w, 2] (row, column) of each patch in the processor's order."""
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    return torch.stack([t.reshape(shape).transpose(1, 2).flatten() for t in (rows, cols)], dim=-1)


def window_order(h: int, w: int, merge: int, window: int) -> tuple[torch.Tensor, list[int]]:
    """The merge blocks regrouped window by window (windows of `window` blocks a side, row-major;
    blocks row-major in each), and each window's length in patches."""
    bh, bw = h // merge, w // merge
    blocks = torch.arange(bh * bw).view(bh, bw)
    order, lengths = [], []
    for r in range(0, bh, window):
        for c in range(0, bw, window):
            cell = blocks[r:r + window, c:c + window].flatten()
            order.append(cell)
            lengths.append(cell.numel() * merge * merge)
    return torch.cat(order), lengths


class QwenVisionTransformer(nn.Module):
    """(patches [t*h*w, C*tp*p*p], grid (t, h, w)) -> the image's tokens [t*h*w/merge^2, text hidden]."""

    def __init__(self, v: VisionArgs, text_hidden: int) -> None:
        super().__init__()
        self.merge, self.full = v.scale_factor, frozenset(v.full_attention_layers)
        self.window = v.window_size // v.scale_factor // v.patch_size
        self.patch_embed = PatchEmbed(v)
        self.blocks = nn.ModuleList(VisionBlock(v) for _ in range(v.num_hidden_layers))
        self.merger = PatchMerger(v, text_hidden)
        self.spatial, self.theta = v.hidden_size // v.num_attention_heads // 2, v.rope_theta
        self.reset_buffers(None)

    def reset_buffers(self, device: torch.device | None) -> None:
        """(Re)compute the rotary frequencies, e.g. after the model was built on the meta device."""
        exponents = torch.arange(0, self.spatial, 2, dtype=torch.float) / self.spatial
        self.register_buffer("inv_freq", (1.0 / self.theta**exponents).to(device), persistent=False)

    def forward(self, patches: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        t, h, w = grid
        unit = self.merge**2
        order, window_lengths = window_order(h, w, self.merge, self.window)
        frames = t * h * w // unit
        order = torch.cat([order + i * (h * w // unit) for i in range(t)])
        window_lengths, full_lengths = window_lengths * t, [h * w] * t
        x = self.patch_embed(patches)
        x = x.view(frames, unit, -1)[order].flatten(0, 1)
        cos, sin = self._rotary(h, w, t, order, unit)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, full_lengths if i in self.full else window_lengths)
        return self.merger(x)[torch.argsort(order)]

    def _rotary(self, h: int, w: int, t: int, order: torch.Tensor, unit: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = block_major_positions(h, w, self.merge).repeat(t, 1).to(self.inv_freq.device)
        angles = (pos[..., None].float() * self.inv_freq).flatten(1)  # [N, head_dim / 2]: rows then columns
        angles = angles.view(-1, unit, angles.shape[-1])[order].flatten(0, 1)
        angles = torch.cat([angles, angles], dim=-1)[:, None, :]
        return angles.cos(), angles.sin()
