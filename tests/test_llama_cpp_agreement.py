"""The bundled chat model against llama.cpp on the same file: identical token ids for real
text and >= 99% teacher-forced top-1 agreement (llama-cpp-python on CPU, installed apart; see
bench/llama_cpp_agreement.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from llama_cpp_agreement import add_site, measure  # noqa: E402

add_site(None)  # MLXR_LLAMA_CPP_SITE
pytest.importorskip("llama_cpp")


@pytest.mark.slow
def test_smollm2_matches_llama_cpp() -> None:
    result = measure("smollm2:135m")
    assert result["same_tokens"]
    assert result["positions"] >= 256
    assert result["top1_agreement"] >= 0.99, result
