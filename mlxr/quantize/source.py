"""What the quantizer reads: a model's GGUF tensor names and shapes up front, then its
tensors one at a time as float32 in llama.cpp's layout, plus the metadata to copy."""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import gguf
import numpy as np

from mlxr.errors import ModelNotFoundError


@dataclass(frozen=True)
class SourceTensor:
    name: str  # GGUF (llama.cpp) name
    shape: tuple[int, ...]  # numpy order


class Source(Protocol):
    arch: str  # general.architecture
    tensors: list[SourceTensor]

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        """Every key but general.architecture, general.file_type and quantization_version."""

    def arrays(self) -> Iterator[tuple[str, np.ndarray]]:
        """(GGUF name, float32 tensor) in the order of `tensors`."""

    def close(self) -> None: ...


def open_source(path: str | os.PathLike[str]) -> Source:
    """An HF model directory or a GGUF file with F32/F16/BF16 tensors."""
    from mlxr.quantize.gguf_source import GGUFSource
    from mlxr.quantize.hf_source import HFSource

    p = Path(path)
    if p.is_dir():
        return HFSource(p)
    if p.is_file():
        return GGUFSource(p)
    raise ModelNotFoundError(f"{p} is neither a model directory nor a GGUF file")
