"""The bundled Gemma 3 270M Q4_K_M GGUF against HF transformers loading the same file
(dequantized to fp32)."""
from __future__ import annotations

import pytest
import torch

from model_fixtures import cached_llm
from mlxr import SamplingParams
from mlxr.loader.resolve import bundled_model_path
from paged_probe import paged_logits, rel_err

TEXT = (
    "The history of astronomy spans thousands of years. Early civilizations tracked the "
    "motions of the Sun, the Moon and the planets to keep calendars and to navigate. In the "
    "sixteenth century, Copernicus proposed that the Earth moves around the Sun, and Galileo's "
    "telescope soon revealed the moons of Jupiter and the phases of Venus. Newton's laws then "
    "explained why the planets follow elliptical orbits, and modern observatories measure "
    "light from galaxies billions of light years away. Spectroscopy showed that stars are "
    "made of the same elements as the Earth, and that most galaxies are moving away from us, "
    "which led to the idea that the universe is expanding. Today, space telescopes observe "
    "planets around other stars, and radio arrays photograph the shadows of black holes."
)


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM

    path = bundled_model_path()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm():
    return cached_llm("gemma3-270m")


@pytest.mark.slow  # loads HF transformers' copy of the bundled model: ~35 s: the default suite keeps under 15 minutes
def test_16_greedy_tokens_after_capital_of_france(hf, llm):
    ids = llm.tokenizer.encode("The capital of France is")
    with torch.inference_mode():
        want = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
    got = llm.generate([ids], SamplingParams(max_tokens=16, temperature=0))[0].outputs[0].token_ids
    assert got == want[: len(got)] and len(got) == len(want)


def test_teacher_forced_128_tokens_match(hf, llm):
    ids = llm.tokenizer.encode(TEXT)[:128]
    assert len(ids) == 128
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].float()
    ours = paged_logits(llm, ids, 64)  # 64 prefill positions, then 64 decode steps
    assert rel_err(ours, ref) <= 1e-3
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= 0.99


@pytest.mark.slow  # ~80 s on 2 cores: the non-default mode; the default one below runs every time
def test_dequantized_cpu_mode_fp16_weights_stays_close_to_hf(hf):
    """`quantization="none"` on CPU (fp32 activations, fp16 weight storage) against HF fp32."""
    from mlxr import LLM

    llm = LLM("gemma3-270m", quantization="none")
    assert llm.loaded.weight_dtype == torch.float16 and llm.loaded.dtype == torch.float32
    model = llm.loaded.model
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied, one copy
    assert_close_to_hf(llm, hf)


def assert_close_to_hf(llm, hf) -> None:
    ids = llm.tokenizer.encode(TEXT)[:128]
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].float()
    ours = paged_logits(llm, ids, 64)
    assert rel_err(ours, ref) <= 2e-3
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.99


def test_default_cpu_mode_quantized_weights_stays_close_to_hf(hf):
    """The default: the file's Q4_K/Q5_0/Q6_K/Q8_0 blocks multiplied as they are, against HF
    transformers running the same file dequantized to fp32."""
    from mlxr import LLM

    llm = LLM("gemma3-270m")
    assert llm.loaded.quantization == "gguf"
    assert_close_to_hf(llm, hf)


def test_prompt_logprobs_of_the_quantized_file_match_hf(hf, llm):
    """Scoring a text (echo + logprobs, lm-evaluation-harness's loglikelihood) on the file's
    quantized blocks against HF's log-softmax over the same file dequantized to fp32."""
    ids = llm.tokenizer.encode(TEXT)[:128]
    scored = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=1))[0].prompt_logprobs
    with torch.inference_mode():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    ours = torch.tensor([scored[p][ids[p]].logprob for p in range(1, len(ids))])
    want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    diff = (ours - want).abs()
    assert diff.max().item() <= 5e-3 and diff.mean().item() <= 1e-3, (diff.max(), diff.mean())
    ranks = [scored[p][ids[p]].rank == int((ref[p - 1] > ref[p - 1, ids[p]]).sum()) + 1 for p in range(1, len(ids))]
    assert sum(ranks) >= 0.98 * len(ranks)
