"""The setup the tests against llama-mtmd-cli share: the binary (the test is skipped without it),
a GGUF + mmproj pair written by llama.cpp's converters (skipped where they are unavailable) and
MLXR's engine on the same two files."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from model_fixtures import FIXTURES, cached_llm


def mtmd_setup(files: Callable[[Path], tuple[Path, Path]]):
    """(llama-mtmd-cli, model GGUF, mmproj GGUF, MLXR's LLM on them); files(FIXTURES) writes the pair."""
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable
    from mlxr.testing.llama_mtmd import mtmd_cli

    exe = mtmd_cli()
    if exe is None:
        pytest.skip("llama-mtmd-cli is not built (set MLXR_LLAMA_BIN to its folder)")
    try:
        model, mmproj = files(FIXTURES)
    except ConverterUnavailable as e:
        pytest.skip(str(e))
    return exe, model, mmproj, cached_llm(str(model), mmproj=str(mmproj))
