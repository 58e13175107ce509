"""An unquantized GGUF file (F32/F16/BF16 tensors) as a quantizer source: its tensors are
already in llama.cpp's names and layouts, and its metadata is copied as it is."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf.constants import GGUFValueType

from mlxr.errors import UnsupportedModelError
from mlxr.formats.gguf import open_gguf
from mlxr.quantize.source import SourceTensor

log = logging.getLogger(__name__)
_FLOAT_TYPES = ("F32", "F16", "BF16")
# Keys the writer sets itself (alignment: it writes the default one).
_NOT_COPIED = frozenset({"general.architecture", "general.file_type", "general.quantization_version",
                         "general.alignment"})
_INT32 = (-(1 << 31), (1 << 31) - 1)


class GGUFSource:
    def __init__(self, path: Path) -> None:
        self.file = open_gguf(path)
        try:
            self.arch = self.file.architecture
            self.tensors = [self._planned(n) for n in self.file.tensor_names]
        except BaseException:
            self.file.close()
            raise

    def _planned(self, name: str) -> SourceTensor:
        info = self.file.tensor_info(name)
        if info.ggml_type not in _FLOAT_TYPES:
            raise UnsupportedModelError(
                f"{self.file.path.name} is already quantized (tensor {name!r} is {info.ggml_type}); "
                "quantize from an F32/F16/BF16 GGUF or a Hugging Face directory")
        return SourceTensor(name, info.shape)

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        for key, value in self.file.metadata.items():
            if key in _NOT_COPIED:
                continue
            vtype = GGUFValueType(self.file.value_types[key])
            if vtype != GGUFValueType.ARRAY:
                w.add_key_value(key, value, vtype)
            elif value:
                w.add_key_value(key, value, vtype, sub_type=_element_type(value))
            else:
                log.warning("dropping the empty metadata array %s", key)

    def arrays(self) -> Iterator[tuple[str, np.ndarray]]:
        for t in self.tensors:
            yield t.name, self.file.load(t.name)

    def close(self) -> None:
        self.file.close()


def _element_type(values: list[Any]) -> GGUFValueType:
    """The element type of a metadata array. Our reader keeps only the values, so the type is
    inferred the way gguf-py's writer does, widening integers that do not fit in int32."""
    if all(isinstance(v, bool) for v in values):
        return GGUFValueType.BOOL
    if all(isinstance(v, str) for v in values):
        return GGUFValueType.STRING
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        lo, hi = min(values), max(values)
        return GGUFValueType.INT32 if _INT32[0] <= lo and hi <= _INT32[1] else GGUFValueType.INT64
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return GGUFValueType.FLOAT32
    if all(isinstance(v, list) for v in values):
        return GGUFValueType.ARRAY
    raise UnsupportedModelError("a GGUF metadata array mixes value types")
