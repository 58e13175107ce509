"""GGUF tensor bytes to float32: the quantized types through `gguf.quants.dequantize`, integer
and F64 tensors (which gguf-py reads as plain numpy arrays) by their little-endian dtype."""
from __future__ import annotations

from functools import cache

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from mlxr.errors import UnsupportedModelError

_PLAIN_TYPES = {"I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "F64": np.float64}


@cache
def _can_dequantize(qtype: GGMLQuantizationType) -> bool:
    if qtype.name in _PLAIN_TYPES:
        return True
    _, type_size = GGML_QUANT_SIZES[qtype]
    try:
        dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except (NotImplementedError, ValueError):
        return False
    return True


def supported_ggml_types() -> list[str]:
    """Names of the tensor types `GGUFFile.load` can dequantize."""
    return [t.name for t in GGML_QUANT_SIZES if _can_dequantize(t)]


def to_float32(name: str, raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Tensor `name`'s stored bytes (as GGUFFile.load_raw gives them) as float32 of `shape`."""
    if type_name in _PLAIN_TYPES:
        values = raw.reshape(-1).view(np.dtype(_PLAIN_TYPES[type_name]).newbyteorder("<"))
        return values.astype(np.float32).reshape(shape)
    qtype = GGMLQuantizationType[type_name]
    if not _can_dequantize(qtype):
        raise UnsupportedModelError(f"GGUF tensor {name!r} has type {type_name}, which we cannot dequantize")
    out = np.ascontiguousarray(dequantize(raw, qtype), dtype=np.float32)
    assert out.shape == tuple(shape), (out.shape, name)
    return out
