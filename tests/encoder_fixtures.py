"""The retrieval tests' tiny random encoders (mlxr/testing/encoder_fixtures.py) under .fixtures/.
Torch-free at import."""
from __future__ import annotations

from pathlib import Path

from mlxr.testing.encoder_fixtures import TEXTS  # noqa: F401 - the tests' texts
from model_fixtures import FIXTURES


def encoder_dir(name: str) -> Path:
    from mlxr.testing.encoder_fixtures import encoder_dir as write

    return write(name, FIXTURES)


def encoder_gguf(name: str, outtype: str = "f32") -> Path:
    """llama.cpp's GGUF of a fixture; skips where its converter cannot be had (no PyPI)."""
    import pytest

    from mlxr.testing.encoder_fixtures import encoder_gguf as convert
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable

    try:
        return convert(name, FIXTURES, outtype)
    except ConverterUnavailable as e:
        pytest.skip(str(e))


def embedding_gemma_dir() -> Path:
    from mlxr.testing.encoder_fixtures import embedding_gemma_dir as write

    return write(FIXTURES)
