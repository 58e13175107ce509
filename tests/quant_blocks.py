"""Random GGUF blocks of any type for kernel tests: random bytes with sane fp16 scale fields."""
from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

# Offsets of each block's fp16 fields (scales and mins); every other byte may be anything.
F16_FIELDS = {"Q4_0": (0,), "Q5_0": (0,), "Q8_0": (0,), "Q4_1": (0, 2), "Q5_1": (0, 2),
              "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
              "IQ4_NL": (0,), "IQ4_XS": (0,)}


def random_blocks(qtype: str, n: int, k: int, seed: int = 0, scale: float = 0.01) -> np.ndarray:
    """(n, row_bytes) uint8: n rows of k weights of `qtype`."""
    rng = np.random.default_rng(seed)
    block_elems, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    raw = rng.integers(0, 256, size=(n, k // block_elems, block_bytes), dtype=np.uint8)
    for at in F16_FIELDS[qtype]:
        values = (rng.standard_normal(raw.shape[:2]) * scale).astype(np.float16)
        raw[..., at:at + 2] = values.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(n, -1)
