"""PEFT LoRA adapters of the tiny fixture models, written by peft itself from random init
(init_lora_weights=False, so B is not zero), once per checkout under .fixtures/lora/; and the
GGUF LoRA llama.cpp's convert_lora_to_gguf.py writes from one of them."""
from __future__ import annotations

from pathlib import Path

import pytest

from model_fixtures import FIXTURES

from mlxr.testing.write_once import write_once

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SPECS = {
    "r4-qv": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "r8-all": dict(r=8, lora_alpha=16, target_modules=ALL),
    "r16-mlp-rslora": dict(r=16, lora_alpha=4, target_modules=["gate_proj", "up_proj", "down_proj"], use_rslora=True),
    "r2-ko": dict(r=2, lora_alpha=2, target_modules=["k_proj", "o_proj"]),
    "r6-all": dict(r=6, lora_alpha=3, target_modules=ALL),
}


def peft_adapter(base_hf: Path, spec: str, seed: int = 0) -> Path:
    """The adapter directory (adapter_config.json, adapter_model.safetensors) of spec on base_hf."""
    final = FIXTURES / "lora" / f"{Path(base_hf).parent.name}-{spec}-s{seed}"
    if final.is_dir():
        return final
    peft = pytest.importorskip("peft")
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_hf, dtype=torch.float32)
    model = peft.get_peft_model(base, peft.LoraConfig(init_lora_weights=False, **SPECS[spec]))
    return write_once(final, model.save_pretrained, spec)


def peft_reference(base_hf: Path, adapter: Path):
    """transformers + peft, fp32, eager attention: the adapter's reference model."""
    import torch
    from peft import PeftModel

    from hf_compare import hf_model

    return PeftModel.from_pretrained(hf_model(base_hf), adapter).eval().to(torch.float32)


def llama_cpp_lora(adapter: Path, base_hf: Path, outtype: str = "f32") -> Path:
    """llama.cpp's GGUF LoRA of a PEFT adapter; skips where its converter cannot be fetched."""
    from mlxr.testing.llama_cpp_convert import ConverterUnavailable, llama_cpp_lora_gguf

    try:
        return llama_cpp_lora_gguf(adapter, base_hf, FIXTURES, outtype)
    except ConverterUnavailable as e:
        pytest.skip(str(e))
