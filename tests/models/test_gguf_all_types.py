"""Every tensor type gguf-py knows loads: GGUFFile.load against gguf-py's own dequantizer
(integers and F64 as numpy reads them), on a file gguf-py's writer wrote with one tensor a type."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from mlxr.formats.gguf import open_gguf
from mlxr.formats.gguf_types import supported_ggml_types
from mlxr.ops.quant.block_types import KEPT_TYPES

_PLAIN = {"I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "F64": np.float64}
# gguf-py knows these names but cannot dequantize them (activation-only or new types).
NOT_WEIGHTS = {"Q8_1", "Q8_K", "Q1_0"}


def test_every_type_but_activation_ones_is_supported() -> None:
    known = {t.name for t in GGML_QUANT_SIZES}
    assert known - set(supported_ggml_types()) <= NOT_WEIGHTS, known - set(supported_ggml_types())
    assert set(KEPT_TYPES) >= {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                               "IQ4_NL", "IQ4_XS", "MXFP4"}


def test_each_type_loads_like_gguf_py(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path, written = tmp_path / "all.gguf", {}
    w = gguf.GGUFWriter(str(path), "llama")
    for name in supported_ggml_types():
        qtype = GGMLQuantizationType[name]
        block, size = GGML_QUANT_SIZES[qtype]
        if name in _PLAIN:
            data = (rng.standard_normal((2, 256)) * 50).astype(_PLAIN[name])
            w.add_tensor(name, data)
        elif name in ("F32", "F16"):
            data = rng.standard_normal((2, 256)).astype(np.float32 if name == "F32" else np.float16)
            w.add_tensor(name, data)
        else:
            data = rng.integers(0, 256, size=(2, 256 // block * size), dtype=np.uint8)
            if name == "BF16":
                data = rng.standard_normal((2, 256)).astype(np.float32).view(np.uint32) >> 16
                data = data.astype(np.uint16).view(np.uint8)
            w.add_tensor(name, data, raw_dtype=qtype)
        written[name] = data
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open_gguf(path) as f:
        for name, data in written.items():
            got = f.load(name)
            if name in _PLAIN or name in ("F32", "F16"):
                want = data.astype(np.float32)
            else:
                want = dequantize(data, GGMLQuantizationType[name]).reshape(2, 256)
            assert got.shape == (2, 256) and np.array_equal(got, want, equal_nan=True), name
        # The loader keeps the types with kernels and expands the rest (with a log line).
        from mlxr.loader.gguf_weights import dequantized_types

        expanded = dequantized_types(f, keep_quantized=True)
    assert "IQ2_XXS" in expanded and "MXFP4" not in expanded and not set(expanded) & set(KEPT_TYPES)
