"""LoRA adapters written by peft on tiny random llama-family bases: MLXR's logits with each
adapter equal transformers + peft fp32 (||d||/||ref|| <= 1e-4), prompt and decode positions."""
from __future__ import annotations

import pytest
import torch

from hf_compare import PROMPT, hf_greedy
from lora_fixtures import peft_adapter, peft_reference
from model_fixtures import cached_llm, fixture_model
from paged_probe import paged_logits, rel_err

CASES = [("tiny-llama", "r4-qv"), ("tiny-llama", "r8-all"), ("tiny-llama", "r16-mlp-rslora"),
         ("tiny-llama", "r2-ko"), ("tiny-qwen2", "r8-all"), ("tiny-mistral", "r6-all")]


def _check(base_name: str, spec: str, **llm_kwargs) -> None:
    base = fixture_model(base_name).hf_dir
    adapter = peft_adapter(base, spec)
    llm = cached_llm(str(base), enable_lora=True, max_loras=2, **llm_kwargs)
    name = f"{base_name}-{spec}"
    if name not in llm.engine.lora_names:
        llm.load_lora(name, str(adapter))
    ref_model = peft_reference(base, adapter)
    ids = PROMPT + hf_greedy(ref_model, PROMPT, 8)
    with torch.inference_mode():
        ref = ref_model(torch.tensor([ids])).logits[0]
        base_ref = ref_model.get_base_model()
        with ref_model.disable_adapter():
            plain = base_ref(torch.tensor([ids])).logits[0]
    assert rel_err(plain, ref) > 1e-3  # the adapter changes the logits: the check below can fail
    ours = paged_logits(llm, ids, len(PROMPT), lora=name).cpu()
    assert rel_err(ours[: len(PROMPT)], ref[: len(PROMPT)]) <= 1e-4
    assert rel_err(ours[len(PROMPT):], ref[len(PROMPT):]) <= 1e-4
    assert rel_err(paged_logits(llm, ids, len(PROMPT)).cpu(), plain) <= 1e-4  # and the base stays the base


@pytest.mark.parametrize("base_name,spec", CASES)
def test_adapter_logits_equal_peft(base_name, spec):
    _check(base_name, spec)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["r8-all", "r16-mlp-rslora"])
def test_adapter_logits_equal_peft_on_cuda(spec):
    """The Triton shrink/expand kernels in the model, fp32 on CUDA, against peft fp32 on the CPU."""
    _check("tiny-llama", spec, device="cuda", engine_process=False)


def test_adapter_on_fp16_weights_equals_peft_within_storage_error():
    """The base stored in fp16 (the CPU default): the adapter's delta still adds on top."""
    base = fixture_model("tiny-llama").hf_dir
    adapter = peft_adapter(base, "r8-all")
    llm = cached_llm(str(base), enable_lora=True, weight_dtype=torch.float16)
    if "a" not in llm.engine.lora_names:
        llm.load_lora("a", str(adapter))
    ref_model = peft_reference(base, adapter)
    with torch.inference_mode():
        ref = ref_model(torch.tensor([PROMPT])).logits[0]
        with ref_model.disable_adapter():
            plain = ref_model(torch.tensor([PROMPT])).logits[0]
    assert rel_err(plain, ref) > 0.1  # far past the tolerance below: without the adapter it fails
    assert rel_err(paged_logits(llm, PROMPT, len(PROMPT), lora="a"), ref) <= 2e-3
