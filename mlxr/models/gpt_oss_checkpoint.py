"""gpt-oss's safetensors layout -> MLXR's parameters (Architecture.checkpoint_tensors).

transformers' GptOssExperts stores gate and up as one gate_up_proj [E, H, 2I], interleaved column
by column (gate even, up odd), and down_proj as [E, I, H]: both are transposed to [E, out, in] and
split. OpenAI's released checkpoints hold the experts as MXFP4 instead (quantization_config
quant_method "mxfp4"): `<proj>_blocks` [E, out, in / 32, 16] uint8, two E2M1 codes a byte (element
2j in the low nibble of byte j, 2j + 1 in the high), and `<proj>_scales` [E, out, in / 32], E8M0
exponents. Those are repacked, losslessly, into GGUF's MXFP4 blocks (the scale byte, then 16 bytes
whose low nibbles are elements 0..15 and high nibbles 16..31) and kept 4-bit."""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import torch

from mlxr.errors import ModelFormatError
from mlxr.layers.quant_linear import PackedWeight

_EXPERTS = re.compile(r"(model\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)(_bias|_blocks|_scales)?")
_MXFP4_PART = ("_blocks", "_scales")


def checkpoint_tensors(items: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in items:
        match = _EXPERTS.fullmatch(name)
        if match is None:
            yield (f"{name}.weight" if name.endswith(".self_attn.sinks") else name), tensor
            continue
        prefix, proj, kind = match.groups()
        if kind not in _MXFP4_PART:
            yield from _float_experts(prefix, proj, kind, tensor)
            continue
        group = pending.setdefault(prefix + proj, {})
        group[kind] = tensor
        if len(group) == 2:
            del pending[prefix + proj]
            yield from _mxfp4_experts(prefix, proj, group["_blocks"], group["_scales"])
    if pending:
        raise ModelFormatError(f"MXFP4 tensor {next(iter(pending))!r} lacks its blocks or its scales")


def _float_experts(prefix: str, proj: str, kind: str | None, t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    if t.dim() != (2 if kind == "_bias" else 3):
        raise ModelFormatError(f"tensor {prefix}{proj}{kind or ''} has shape {tuple(t.shape)}")
    suffix = "bias" if kind == "_bias" else "weight"
    if kind != "_bias":
        t = t.transpose(1, 2)  # [E, in, out] -> [E, out, in]
    if proj == "down_proj":
        yield f"{prefix}down_proj.{suffix}", t.contiguous()
        return
    yield f"{prefix}gate_proj.{suffix}", t[:, ::2].contiguous()
    yield f"{prefix}up_proj.{suffix}", t[:, 1::2].contiguous()


def _mxfp4_experts(prefix: str, proj: str, blocks: torch.Tensor, scales: torch.Tensor) -> Iterator[tuple[str, PackedWeight]]:
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.dim() != 4 or blocks.shape[-1] != 16 \
            or tuple(scales.shape) != tuple(blocks.shape[:3]):
        raise ModelFormatError(f"MXFP4 tensors of {prefix}{proj} have shapes {tuple(blocks.shape)} and "
                               f"{tuple(scales.shape)} ([E, out, in / 32, 16] and [E, out, in / 32] uint8)")
    raw = gguf_blocks(blocks, scales)
    e, n, nb, _ = raw.shape
    parts = [("down_proj", raw)] if proj == "down_proj" else [("gate_proj", raw[:, ::2]), ("up_proj", raw[:, 1::2])]
    for part, rows in parts:
        yield f"{prefix}{part}.weight", PackedWeight(rows.reshape(e, rows.shape[1], nb * 17).contiguous(), "MXFP4",
                                                     (e, rows.shape[1], nb * 32))


def gguf_blocks(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[..., nb, 16] OpenAI-packed codes and [..., nb] scales -> [..., nb, 17] GGUF MXFP4 blocks."""
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # elements 0..31 in order
    packed = codes[..., :16] | (codes[..., 16:] << 4)
    return torch.cat([scales.unsqueeze(-1), packed], dim=-1)
