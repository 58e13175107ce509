"""Linear and embedding layers, and stacked experts, whose weights stay in GGUF quantized blocks.

The weight is a uint8 buffer (N, K // block_elems * block_bytes), the file's bytes for each
output row, so resident memory is the file's size. A tied lm_head shares the embedding's
buffer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mlxr.ops.quant.block_types import quant_type
from mlxr.ops.quant.quant import dequantize_rows, prepare_repacked, qmatmul


@dataclass
class PackedWeight:
    """A weight as GGUF blocks: raw (N, row bytes) uint8 of type qtype, logical shape (N, K);
    stacked experts have a leading expert dim: (E, N, row bytes), shape (E, N, K)."""

    raw: torch.Tensor
    qtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        *rows, k = self.shape
        want = (*rows, quant_type(self.qtype).row_bytes(k))
        if self.raw.dtype != torch.uint8 or tuple(self.raw.shape) != want:
            raise ValueError(f"{self.qtype} weight of shape {self.shape} needs uint8 {want}, got "
                             f"{self.raw.dtype} {tuple(self.raw.shape)}")

    def to(self, device: torch.device) -> PackedWeight:
        return PackedWeight(self.raw.to(device).contiguous(), self.qtype, self.shape)


class QuantLinear(nn.Module):
    def __init__(self, packed: PackedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("raw", packed.raw, persistent=False)
        self.qtype = packed.qtype
        self.out_features, self.in_features = packed.shape
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.repacked = None

    def reset_buffers(self, device: torch.device | None) -> None:
        """Called once the weights sit on their device: the repacked GEMM's layout, where the
        measured table picks it for this type and shape (ops/quant/repack.py: its memory cost)."""
        self.repacked = prepare_repacked(self.raw, self.qtype, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = qmatmul(x, self.raw, self.qtype, self.in_features, self.repacked)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {self.qtype}"


class QuantEmbedding(nn.Module):
    def __init__(self, packed: PackedWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("raw", packed.raw, persistent=False)
        self.qtype = packed.qtype
        self.num_embeddings, self.embedding_dim = packed.shape
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return dequantize_rows(self.raw, ids, self.qtype, self.embedding_dim).to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.qtype}"


class QuantStacked(nn.Module):
    """Stacked expert weights kept as a GGUF file's blocks, [E, out, row bytes] uint8, with the
    experts' biases [E, out] where the replaced module had them (gpt-oss)."""

    def __init__(self, packed: PackedWeight, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("raw", packed.raw, persistent=False)
        self.qtype = packed.qtype
        self.in_features = packed.shape[-1]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def matmul(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        y = qmatmul(rows, self.raw[e], self.qtype, self.in_features)
        return y if self.bias is None else y + self.bias[e].to(y.dtype)


def install_packed(model: nn.Module, packed: dict[str, PackedWeight], dtype: torch.dtype, tied: bool) -> None:
    """Replace the nn.Linear / nn.Embedding owning each packed `<module>.weight` by its quantized
    twin; with tied embeddings a packed embedding also becomes the lm_head."""
    for name, weight in packed.items():
        path = name.removesuffix(".weight")
        parent_path, _, attr = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        old = getattr(parent, attr)
        if len(weight.shape) == 3:
            setattr(parent, attr, QuantStacked(weight, getattr(old, "bias", None)))
        elif isinstance(old, nn.Embedding):
            setattr(parent, attr, QuantEmbedding(weight, dtype))
        else:
            setattr(parent, attr, QuantLinear(weight, getattr(old, "bias", None)))
    embed = packed.get("model.embed_tokens.weight")
    if tied and embed is not None and hasattr(model, "lm_head"):
        model.lm_head = QuantLinear(embed)
