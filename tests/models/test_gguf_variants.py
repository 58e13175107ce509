"""Every registered architecture's GGUF, as llama.cpp's own converter writes it, against HF
transformers fp32 on the same checkpoint, over configs of our own (mlxr/testing/arch_variants.py):
prompt logits within 1e-4 and 32 greedy tokens, from the converter's file and from safetensors.

Where the converter drops a setting (Gemma's query_pre_attn_scalar, Qwen3-MoE's norm_topk_prob,
Gemma 2's lm_head), the file is compared with HF under the setting llama.cpp's runtime applies,
the dropped setting is shown to matter, and llama-server (MLXR_LLAMA_SERVER) on the same file
gives MLXR's tokens."""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
import torch

from hf_compare import (PROMPT, check_greedy, check_logits, hf_model, llama_cpp_gguf, llama_server_binary,
                        llama_server_tokens)
from mlxr import SamplingParams
from mlxr.models import ARCHITECTURES, ENCODERS
from mlxr.errors import UnsupportedModelError
from mlxr.testing.arch_variants import REFUSED, VARIANTS
from mlxr.testing.hybrid_fixtures import HYBRID_ARCHS
from model_fixtures import FIXTURES, cached_llm
from paged_probe import rel_err


def _marked(names):
    return [pytest.param(n, marks=[pytest.mark.slow] if VARIANTS[n].slow else []) for n in names]


ALL = _marked(sorted(VARIANTS))
LOSSY = _marked(sorted(n for n, v in VARIANTS.items() if v.gguf_runs_as))


def variant_dir(name: str) -> Path:
    """The variant's HF directory, written once; the name carries a hash of its config."""
    from mlxr.testing.arch_fixtures import arch_fixture_dir

    spec = VARIANTS[name].fixture if name in VARIANTS else REFUSED[name][0]
    tag = zlib.crc32(json.dumps([spec.config, spec.seed, spec.gemma_norms], sort_keys=True).encode())
    return arch_fixture_dir(f"{name}-{tag:08x}", FIXTURES, spec)


_HF: dict = {}


def hf_of(name: str, as_gguf: bool):
    key = (name, as_gguf)
    if key not in _HF:
        changes = VARIANTS[name].gguf_runs_as if as_gguf else {}
        hf = hf_model(variant_dir(name), **changes)
        if changes.get("tie_word_embeddings"):  # HF keeps a stored lm_head whatever the config says
            with torch.no_grad():
                hf.lm_head.weight.copy_(hf.get_input_embeddings().weight)
        _HF[key] = hf
    return _HF[key]


def test_every_registered_architecture_has_a_variant():
    # encoders (tests/models/test_encoders.py) and the vision models (test_llava.py, test_idefics3.py,
    # test_qwen25_vl.py and their _gguf twins) have tests of their own;
    # MLXR reads no Gemma 4 GGUF yet (models/gemma4.py); hybrid models' variants (value heads per
    # key head, dense and MoE): tests/models/test_qwen35.py
    assert {v.arch for v in VARIANTS.values()} == set(ARCHITECTURES) - ENCODERS - {"llava", "idefics3", "qwen2_5_vl", "gemma4"} \
        - set(HYBRID_ARCHS)


@pytest.mark.parametrize("name", ALL)
def test_llama_cpp_gguf_matches_hf(name):
    llm = cached_llm(llama_cpp_gguf(variant_dir(name)))
    check_logits(hf_of(name, True), llm)
    check_greedy(hf_of(name, True), llm)


@pytest.mark.parametrize("name", ALL)
def test_safetensors_matches_hf(name):
    llm = cached_llm(str(variant_dir(name)))
    check_logits(hf_of(name, False), llm)
    check_greedy(hf_of(name, False), llm)


@pytest.mark.parametrize("name", LOSSY)
def test_the_setting_the_converter_drops_changes_hf_logits(name):
    with torch.inference_mode():
        ids = torch.tensor([PROMPT])
        assert rel_err(hf_of(name, True)(ids).logits[0], hf_of(name, False)(ids).logits[0]) > 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("name", LOSSY)
def test_llama_server_runs_the_converters_file_as_mlxr_does(name):
    llama_server_binary()  # skips before the conversion where there is none
    gguf = llama_cpp_gguf(variant_dir(name))
    # 16 tokens: ggml's sums in another order flip gguf-qwen3moe-unnormalised's token 17, where HF's
    # top two logits are 0.0012 apart (MLXR follows HF there: test_llama_cpp_gguf_matches_hf).
    ours = cached_llm(gguf).generate([PROMPT], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    assert llama_server_tokens(gguf, 16) == ours[0].outputs[0].token_ids


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_from_both_sources_naming_the_setting(name):
    from mlxr import LLM

    fragment = REFUSED[name][1]
    for path in (variant_dir(name), llama_cpp_gguf(variant_dir(name))):
        with pytest.raises(UnsupportedModelError, match=fragment):
            LLM(str(path), dtype=torch.float32)
