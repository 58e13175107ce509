"""Split checkpoint tensors that stack several parameters by rows (Architecture.fused_tensors)."""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TypeVar

from mlxr.errors import ModelFormatError
from mlxr.model_config import ModelArgs
from mlxr.models import architecture

T = TypeVar("T")  # numpy array or torch tensor: anything sliced by rows
_LAYER = re.compile(r"(model\.layers\.\d+\.)(.+)")


def split_fused(name: str, value: T, args: ModelArgs) -> Iterator[tuple[str, T]]:
    """(name, value) itself, or its parts where the architecture fuses this tensor."""
    match = _LAYER.fullmatch(name)
    parts = architecture(args.model_type).fused_tensors(args).get(match.group(2)) if match else None
    if parts is None:
        yield name, value
        return
    total = sum(rows for _, rows in parts)
    if value.shape[0] != total:
        raise ModelFormatError(f"tensor {name!r} has {value.shape[0]} rows, expected {total}")
    start = 0
    for part, rows in parts:
        yield match.group(1) + part, value[start:start + rows]
        start += rows
