"""What the quantizer reads: a model's GGUF tensor names and shapes up front, then its
tensors one at a time as float32 in llama.cpp's layout, plus the metadata to copy."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import gguf
import numpy as np


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

