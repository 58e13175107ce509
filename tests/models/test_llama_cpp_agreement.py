"""The bundled chat model against llama.cpp on the same file (llama-cpp-python on CPU,
installed apart, MLXR_LLAMA_CPP_SITE; see bench/peers/llama_cpp_agreement.py): identical token ids,
and teacher-forced top-1 over 321 positions of real text, with HF transformers on the
dequantized file as the third opinion."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "peers"))
from llama_cpp_agreement import add_site, measure  # noqa: E402
from tokenizer_texts import TEXTS  # noqa: E402

add_site(None)  # MLXR_LLAMA_CPP_SITE
pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def result() -> dict:
    return measure("smollm2:135m", probes=TEXTS)


@pytest.mark.slow
def test_smollm2_tokenizes_like_llama_cpp(result: dict) -> None:
    assert result["same_tokens"]
    assert result["probe_texts_tokenized_differently"] == []


@pytest.mark.slow
def test_smollm2_follows_hf_transformers_on_the_dequantized_file(result: dict) -> None:
    assert result["positions"] >= 256
    assert result["mlxr_vs_hf_fp32_top1"] >= 0.99, result


# Measured 2026-11-24 (AMD EPYC, bench/results/llama_cpp_agreement-*.json): MLXR agrees with HF
# transformers fp32 on every position, llama.cpp agrees with both on 94.7% (its logits are
# 4% away from fp32: it quantizes activations for its Q4_1 dot products).
@pytest.mark.slow
@pytest.mark.xfail(reason="llama.cpp's own Q4_1 numerics: 94.7% top-1 against fp32", strict=False)
def test_smollm2_top1_agrees_with_llama_cpp(result: dict) -> None:
    assert result["top1_agreement"] >= 0.99, result


@pytest.mark.slow
def test_smollm2_top1_agrees_with_llama_cpp_once_its_activations_are_not_rounded(result: dict) -> None:
    """llama.cpp on an F32 copy of the same file (its own quantizer dequantizes every weight):
    the same weights without its 8-bit activation rounding. MLXR's top-1 equals it; the
    rounding alone moves llama.cpp's own top-1 at ~5% of the positions (measured 2026-11-25:
    100% / 94.7%)."""
    assert result["mlxr_vs_llama_cpp_on_f32_copy_top1"] >= 0.99, result

