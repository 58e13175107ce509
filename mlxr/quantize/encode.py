"""float32 tensor -> the bytes of one ggml tensor type.

Q8_0, Q4_0, Q5_0, Q4_1 and Q5_1 come from gguf-py's `gguf.quants.quantize`; the K-quants and
IQ4_NL from our numpy quantizers (kquants.py, low_bit.py), checked against gguf-py's
dequantizers in the tests.
"""
from __future__ import annotations

import math

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize

from mlxr.quantize.kquants import quantize_q4_k, quantize_q6_k
from mlxr.quantize.low_bit import quantize_iq4_nl, quantize_q2_k, quantize_q3_k, quantize_q5_k

Q = GGMLQuantizationType
_GGUF_PY = frozenset({Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_1, Q.Q5_1})
_OURS = {Q.Q4_K: quantize_q4_k, Q.Q6_K: quantize_q6_k, Q.Q5_K: quantize_q5_k, Q.Q3_K: quantize_q3_k,
         Q.Q2_K: quantize_q2_k, Q.IQ4_NL: quantize_iq4_nl}
SUPPORTED = frozenset({Q.F32, Q.F16, *_OURS} | _GGUF_PY)


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
    if qtype in _OURS:
        return _OURS[qtype](x)
    return quantize(x, qtype)
