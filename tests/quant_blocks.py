"""Random blocks of any kept type for kernel tests (random bytes with sane scale fields), and the
reference dequantizers we did not write: gguf-py's for GGUF types; for NF4 a numpy transcription
of bitsandbytes' rule (code[q] * absmax, high nibble first) over QLoRA's published table."""
from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

NF4_TABLE = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                      -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                      0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                      0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)

# Offsets of each block's fp16 fields (scales and mins); every other byte may be anything.
F16_FIELDS = {"Q4_0": (0,), "Q5_0": (0,), "Q8_0": (0,), "Q4_1": (0, 2), "Q5_1": (0, 2),
              "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
              "IQ4_NL": (0,), "IQ4_XS": (0,)}


def _geometry(qtype: str) -> tuple[int, int]:
    return (64, 36) if qtype == "NF4" else GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]


def random_blocks(qtype: str, n: int, k: int, seed: int = 0, scale: float = 0.01) -> np.ndarray:
    """(n, row_bytes) uint8: n rows of k weights of `qtype`."""
    rng = np.random.default_rng(seed)
    block_elems, block_bytes = _geometry(qtype)
    raw = rng.integers(0, 256, size=(n, k // block_elems, block_bytes), dtype=np.uint8)
    if qtype == "NF4":  # a float32 absmax per block
        absmax = np.abs(rng.standard_normal(raw.shape[:2]) * scale).astype(np.float32)
        raw[..., 0:4] = absmax.view(np.uint8).reshape(*raw.shape[:2], 4)
        return raw.reshape(n, -1)
    for at in F16_FIELDS[qtype]:
        values = (rng.standard_normal(raw.shape[:2]) * scale).astype(np.float16)
        raw[..., at:at + 2] = values.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(n, -1)


def reference_dequantize(raw: np.ndarray, qtype: str, n: int, k: int) -> np.ndarray:
    """(n, k) float32 by the reference dequantizer of the type."""
    if qtype != "NF4":
        return gguf_dequantize(raw, GGMLQuantizationType[qtype]).reshape(n, k)
    blocks = raw.reshape(-1, 36)
    absmax = blocks[:, 0:4].copy().view(np.float32)
    q = np.stack([blocks[:, 4:] >> 4, blocks[:, 4:] & 15], axis=-1).reshape(-1, 64)
    return (NF4_TABLE[q] * absmax).reshape(n, k)
