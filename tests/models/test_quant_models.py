"""Whole models on quantized weights: teacher-forced top-1 agreement with the same file
dequantized to fp32, over 512 tokens, and resident weight memory. The quantized model reads
the first 16 tokens by prefill and the rest by single-token decode steps, so both its GEMM and
its integer GEMV paths are judged; the fp32 reference reads all 512 in one prefill."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from mlxr.layers.quant_linear import QuantEmbedding, QuantLinear
from mlxr.llm import LLM
from mlxr.ops.quant import cpu as quant_cpu
from mlxr.types import SamplingParams
from paged_probe import paged_logits

if not quant_cpu.available():
    pytest.skip("no C compiler for the CPU kernels", allow_module_level=True)

N_TOKENS, N_PROMPT = 512, 16
MIN_AGREEMENT = 0.995  # issue 17's bound: top-1 agreement with the file dequantized to fp32


def teacher_forced_agreement(model: str, **ref_kwargs) -> float:
    quant = LLM(model, quantization="auto", max_num_seqs=1)
    ref = LLM(model, quantization="none", dtype="float32", max_num_seqs=1, **ref_kwargs)
    prompt = quant.tokenizer.encode("Once upon a time, in a small village by the sea, there lived")
    # Sampled (not greedy) text, so the sequence does not collapse into a repeated phrase.
    text = quant.generate([prompt], SamplingParams(max_tokens=N_TOKENS - len(prompt), temperature=1.0,
                                                   top_k=40, seed=0, ignore_eos=True))[0].outputs[0].token_ids
    ids = (prompt + list(text))[:N_TOKENS]
    ours = paged_logits(quant, ids, N_PROMPT)[:-1].argmax(-1)
    theirs = paged_logits(ref, ids, len(ids))[:-1].argmax(-1)
    agreement = float((ours == theirs).float().mean())
    print(f"{model}: top-1 agreement {agreement:.4f} over {len(ids) - 1} positions")
    return agreement


def quantized_bytes(llm: LLM) -> int:
    seen, total = set(), 0
    for m in llm.loaded.model.modules():
        if isinstance(m, (QuantLinear, QuantEmbedding)) and m.raw.data_ptr() not in seen:
            seen.add(m.raw.data_ptr())
            total += m.raw.numel()
    return total


@pytest.mark.slow  # ~30 s; test_bundled_smollm2_q4_1_agrees_... runs the same check on the other bundled file
def test_bundled_gemma_q4_k_m_agrees_with_its_fp32_dequantization():
    assert teacher_forced_agreement("gemma3-270m") >= MIN_AGREEMENT


def test_bundled_gemma_keeps_its_weights_at_the_file_size():
    llm = LLM("gemma3-270m", max_num_seqs=1)
    assert llm.loaded.quantization == "gguf"
    # The tied lm_head shares the embedding's bytes: one Q8_0 buffer, not two.
    model = llm.loaded.model
    assert model.lm_head.raw.data_ptr() == model.model.embed_tokens.raw.data_ptr()
    file_size = llm.loaded.source.path.stat().st_size
    resident = quantized_bytes(llm) + sum(p.numel() * p.element_size() for p in model.parameters())
    assert 0.9 * file_size <= resident <= 1.02 * file_size, (resident, file_size)


@pytest.mark.slow  # ~15 s: the default suite keeps under 15 minutes
def test_bundled_smollm2_q4_1_agrees_with_its_fp32_dequantization():
    """The instruct model's Q4_1 weights run quant.c's integer kernel on the CPU."""
    assert teacher_forced_agreement("smollm2:135m") >= MIN_AGREEMENT


def test_bundled_smollm2_keeps_its_q4_1_weights_quantized_on_the_cpu():
    llm = LLM("smollm2:135m", max_num_seqs=1)
    layers = [m for m in llm.loaded.model.modules() if isinstance(m, QuantLinear)]
    assert layers and {m.qtype for m in layers} >= {"Q4_1"}
    file_size = llm.loaded.source.path.stat().st_size
    assert quantized_bytes(llm) <= 1.02 * file_size


TINYLLAMA_FILES = Path(os.environ.get("MLXR_TINYLLAMA_GGUF_DIR", ".fixtures/tinyllama-quantized"))


@pytest.mark.slow
@pytest.mark.parametrize("file_type", ["q8_0", "q4_k_m"])
def test_tinyllama_shape_agrees_with_its_fp32_dequantization(file_type):
    """The TinyLlama shape (random weights, 1.1B) quantized by `mlxr quantize`: minutes on a
    2-core CPU, so it is marked slow; bench/quant_cpu.py writes the files."""
    path = TINYLLAMA_FILES / f"tinyllama-shape-{file_type}.gguf"
    if not path.exists():
        pytest.skip(f"{path} not written; bench/quant_cpu.py writes it")
    torch.manual_seed(0)
    assert teacher_forced_agreement(str(path)) >= MIN_AGREEMENT
