"""The GGUF block types MLXR keeps quantized in memory, and their block geometry.

A quantized weight is a uint8 tensor of shape (N, K // block_elems * block_bytes): each row is
one output channel's blocks exactly as the GGUF file stores them, so loading is a copy and the
resident size is the file's. Every other GGUF type is dequantized at load.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QuantType:
    name: str
    code: int  # the id the CPU kernels switch on (mlxr/ops/quant/quant.c)
    block_elems: int
    block_bytes: int

    def row_bytes(self, k: int) -> int:
        if k % self.block_elems:
            raise ValueError(f"{self.name} rows need a multiple of {self.block_elems} columns, got {k}")
        return k // self.block_elems * self.block_bytes


QUANT_TYPES: dict[str, QuantType] = {
    t.name: t
    for t in (
        QuantType("Q4_0", 0, 32, 18),
        QuantType("Q5_0", 1, 32, 22),
        QuantType("Q8_0", 2, 32, 34),
        QuantType("Q4_K", 3, 256, 144),
        QuantType("Q5_K", 4, 256, 176),
        QuantType("Q6_K", 5, 256, 210),
    )
}


# Kept quantized by their own kernels (mlxr/ops/quant/extra.py: quant_extra.c, Triton in
# extra_triton.py); their codes (after the core types') are quant_extra.c's.
EXTRA_TYPES: dict[str, QuantType] = {
    t.name: t
    for t in (
        QuantType("Q4_1", 6, 32, 20),
        QuantType("Q5_1", 7, 32, 24),
        QuantType("Q2_K", 8, 256, 84),
        QuantType("Q3_K", 9, 256, 110),
        QuantType("IQ4_NL", 10, 32, 18),
        QuantType("IQ4_XS", 11, 256, 136),
        # bitsandbytes NF4 (mlxr/loader/bnb_nf4.py): per 64 weights a float32 absmax, then bnb's
        # 32 packed bytes as saved (element 2j in the high nibble of byte j, 2j+1 in the low).
        QuantType("NF4", 12, 64, 36),
    )
}
# gpt-oss's expert type, multiplied by its own kernels (mlxr/ops/quant/mxfp4.py: torch on bounded
# slices on the CPU, Triton on CUDA); no C build takes its code.
MXFP4_TYPES: dict[str, QuantType] = {"MXFP4": QuantType("MXFP4", 13, 32, 17)}
KEPT_TYPES: dict[str, QuantType] = {**QUANT_TYPES, **EXTRA_TYPES, **MXFP4_TYPES}
# The types quant.c's integer kernel takes on the CPU: the core ones and Q4_1 (Q4_0's codes with
# a per-block offset). The others of EXTRA_TYPES run quant_extra.c there.
CPU_INT_TYPES: dict[str, QuantType] = {**QUANT_TYPES, "Q4_1": EXTRA_TYPES["Q4_1"]}


def quant_type(name: str) -> QuantType:
    try:
        return KEPT_TYPES[name]
    except KeyError:
        raise ValueError(f"{name} is not kept quantized; kept types: {', '.join(KEPT_TYPES)}") from None
