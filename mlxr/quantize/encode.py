"""float32 tensor -> the bytes of one ggml tensor type.

Q8_0, Q4_0 and Q5_0 come from gguf-py's `gguf.quants.quantize`; Q4_K and Q6_K from our
numpy quantizers, checked against gguf-py's dequantizers in the tests.
"""
from __future__ import annotations

import math

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize

from mlxr.quantize.kquants import quantize_q4_k, quantize_q6_k

Q = GGMLQuantizationType
_GGUF_PY = frozenset({Q.Q8_0, Q.Q4_0, Q.Q5_0})
SUPPORTED = frozenset({Q.F32, Q.F16, Q.Q4_K, Q.Q6_K} | _GGUF_PY)


def block_size(qtype: GGMLQuantizationType) -> int:
    return GGML_QUANT_SIZES[qtype][0]


def encoded_nbytes(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return math.prod(shape) // block * size


def encode(array: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """The tensor's data as GGUF stores it: F32/F16 as floats, quantized types as uint8 rows."""
    if qtype not in SUPPORTED:
        raise ValueError(f"cannot write ggml type {qtype.name}")
    if array.shape[-1] % block_size(qtype):
        raise ValueError(f"row length {array.shape[-1]} is not a multiple of the {qtype.name} block size")
    x = np.ascontiguousarray(array, dtype=np.float32)
    if qtype == Q.F32:
        return x
    if qtype == Q.F16:
        return x.astype(np.float16)
    if qtype == Q.Q4_K:
        return quantize_q4_k(x)
    if qtype == Q.Q6_K:
        return quantize_q6_k(x)
    return quantize(x, qtype)
