"""Every architecture the package registers (mlxr.models.ARCHITECTURES) against HF transformers
fp32 on its tiny random fixture, from safetensors and from a GGUF: logits over a prompt and 16
decode steps, and 32 greedy tokens. A new architecture joins by registering: its fixture is
`tiny-<name>` (mlxr/testing/arch_fixtures.py or fixtures.py); what sets it apart is data below."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch

from mlxr.testing.hybrid_fixtures import HYBRID_ARCHS
from hf_compare import PROMPT, arch_fixture, check_greedy, check_logits, hf_model, llama_cpp_gguf
from mlxr.models import ARCHITECTURES, ENCODERS
from model_fixtures import cached_llm, fixture_model
from paged_probe import paged_logits, rel_err


def _gemma2_args(args) -> None:
    assert (args.sliding_window, args.sliding_layers) == (8, (True, False, True, False))


def _mistral_args(args) -> None:
    assert args.sliding_window == 8


def _phi3_args(args) -> None:
    assert (args.rope_scaling.rope_type, args.rope_scaling.original_max_position_embeddings) == ("longrope", 16)


def _experts_kept(llm) -> None:
    from mlxr.layers.quant_linear import QuantStacked

    experts = llm.loaded.model.model.layers[0].mlp.experts
    assert all(isinstance(m, QuantStacked) and m.qtype == "Q8_0"
               for m in (experts.gate_proj, experts.up_proj, experts.down_proj))


def _fused_kept(llm) -> None:
    """attn_qkv and ffn_up (gate+up) blocks split by rows, kept as blocks, merged again at load."""
    from mlxr.layers.quant_linear import QuantLinear

    layer = llm.loaded.model.model.layers[0]
    assert llm.loaded.quantization == "gguf"
    assert isinstance(layer.self_attn.qkv_proj, QuantLinear) and isinstance(layer.mlp.gate_up_proj, QuantLinear)


@dataclass(frozen=True)
class Case:
    """What one architecture's test checks beyond the shared comparison."""
    # HF config changes that each must change HF's logits of PROMPT (the fixture exercises them),
    # with the relative difference they must reach.
    features: tuple[tuple[dict, float], ...] = ()
    check_args: Callable[[Any], None] | None = None  # on the loaded ModelArgs, before the logits
    # Whose converter writes the GGUF compared: "llama.cpp", or "mlxr" (the main fixtures' GGUF,
    # so the case runs on mlxr/testing/fixtures.py's model even where an arch fixture exists);
    # "none": MLXR reads no GGUF of this architecture yet.
    gguf: str = "llama.cpp"
    short_prompt: bool = False  # also PROMPT[:8] + 7 decode steps (Phi-3's short RoPE factors)
    # llama.cpp's converter drops the sliding window: its file runs full attention, against HF
    # without a window.
    llama_cpp_full_attention: bool = False
    # llama.cpp's Q8_0 file kept quantized: the check on the loaded model, then the logits of the
    # same file dequantized.
    q8_0_kept: Callable[[Any], None] | None = None
    notes: str = field(default="", compare=False)


CASES: dict[str, Case] = {
    "gemma2": Case(features=(({"sliding_window": 4096}, 1e-3), ({"attn_logit_softcapping": None}, 1e-3),
                             ({"final_logit_softcapping": None}, 1e-3)), check_args=_gemma2_args,
                   notes="alternating sliding windows, attention and final logit soft-caps"),
    "mistral": Case(features=(({"sliding_window": None}, 1e-2),), check_args=_mistral_args, gguf="mlxr",
                    llama_cpp_full_attention=True, notes="a sliding window on every layer; MLXR's GGUF keeps it"),
    "phi3": Case(check_args=_phi3_args, short_prompt=True, q8_0_kept=_fused_kept,
                 notes="fused qkv and gate_up tensors, LongRoPE (rope_factors_long/short tensors)"),
    "mixtral": Case(q8_0_kept=_experts_kept, notes="router top-k over more experts than it picks"),
    "granite": Case(notes="embedding, residual, attention and logits multipliers"),
    "olmo2": Case(notes="post-norms, q/k norms over all heads"),
    "qwen3": Case(notes="per-head q/k RMSNorm"),
    "qwen3moe": Case(notes="sparse experts; GGUF ffn_*_exps"),
    # With v its own projection transformers gives the full layers a freshly initialised one.
    "gemma4": Case(features=(({"sliding_window": 4096}, 1e-3), ({"final_logit_softcapping": None}, 1e-3),
                             ({"enable_moe_block": False}, 1e-2),
                             ({"attention_k_eq_v": False}, 1e-3)),
                   gguf="none", notes="per-layer inputs, shared K/V, k = v, MoE beside the MLP; HF only"),
}
# LLaVA, Idefics3 and Qwen2.5-VL take images and have no text-only checkpoint: tests/models/test_llava.py and
# test_idefics3.py, test_qwen25_vl.py check them; encoders: tests/models/test_encoders.py; hybrid models (recurrent
# state): tests/models/test_qwen35.py.
ARCHS = sorted(set(ARCHITECTURES) - ENCODERS - {"llava", "idefics3", "qwen2_5_vl"} - set(HYBRID_ARCHS))
SOURCES = ["safetensors", "gguf"]


def case(arch: str) -> Case:
    return CASES.get(arch, Case())


def hf_dir(arch: str):
    """tiny-<arch>: an architecture fixture, else (or where the case compares MLXR's GGUF) one of
    the main fixtures (llama, qwen2, gemma3, mistral)."""
    from mlxr.testing.arch_fixtures import ARCH_FIXTURES

    name = f"tiny-{arch}"
    if name in ARCH_FIXTURES and case(arch).gguf != "mlxr":
        return arch_fixture(name)
    return fixture_model(name).hf_dir


def model_path(arch: str, source: str) -> str:
    if source == "safetensors":
        return str(hf_dir(arch))
    if case(arch).gguf == "none":
        pytest.skip(f"MLXR reads no {arch} GGUF yet")
    if case(arch).gguf == "mlxr":
        return str(fixture_model(f"tiny-{arch}").gguf_path)
    return llama_cpp_gguf(hf_dir(arch))


_HF: dict = {}


def hf_of(arch: str):
    """One HF model per architecture for the module (building it is most of a case's time)."""
    if arch not in _HF:
        _HF[arch] = hf_model(hf_dir(arch))
    return _HF[arch]


def test_every_case_names_a_registered_architecture():
    assert set(CASES) <= set(ARCHITECTURES)


@pytest.mark.parametrize(("arch", "change", "least"),
                         [(a, change, least) for a in ARCHS for change, least in case(a).features])
def test_each_feature_changes_hf_logits_of_this_prompt(arch, change, least):
    other = hf_model(hf_dir(arch), **change)
    with torch.inference_mode():
        ids = torch.tensor([PROMPT])
        assert rel_err(hf_of(arch)(ids).logits[0], other(ids).logits[0]) > least


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_hf(arch, source):
    llm = cached_llm(model_path(arch, source))
    if case(arch).check_args:
        case(arch).check_args(llm.loaded.model.args)
    check_logits(hf_of(arch), llm)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("arch", ARCHS)
def test_32_greedy_tokens_match_hf(arch, source):
    check_greedy(hf_of(arch), cached_llm(model_path(arch, source)))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("arch", [a for a in ARCHS if case(a).short_prompt])
def test_logits_match_hf_on_a_short_prompt(arch, source):
    check_logits(hf_of(arch), cached_llm(model_path(arch, source)), PROMPT[:8], n_decode=7)  # positions 0..14


@pytest.mark.parametrize("arch", [a for a in ARCHS if case(a).llama_cpp_full_attention])
def test_llama_cpp_gguf_runs_full_attention_as_llama_cpp_does(arch):
    llm = cached_llm(llama_cpp_gguf(hf_dir(arch)))
    assert llm.loaded.model.args.sliding_window is None
    full = hf_model(hf_dir(arch), sliding_window=None)
    check_logits(full, llm)
    check_greedy(full, llm)


@pytest.mark.parametrize("arch", [a for a in ARCHS if case(a).q8_0_kept])
def test_q8_0_gguf_keeps_its_tensors_quantized(arch):
    path = llama_cpp_gguf(hf_dir(arch), "q8_0")
    kept, expanded = cached_llm(path, quantization="auto"), cached_llm(path, quantization="none")
    case(arch).q8_0_kept(kept)
    ids = PROMPT[:12]
    assert rel_err(paged_logits(kept, ids, 8), paged_logits(expanded, ids, 8)) <= 1e-3
