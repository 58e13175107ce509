"""Model classes by canonical model_type, and the aliases that map onto them."""
from __future__ import annotations

from torch import nn

from mlxr.config import ModelArgs
from mlxr.errors import UnsupportedModelError
from mlxr.models.gemma3 import Gemma3ForCausalLM
from mlxr.models.llama import LlamaForCausalLM
from mlxr.models.qwen2 import Qwen2ForCausalLM

MODELS: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "gemma3": Gemma3ForCausalLM,
}

# HF model_type / GGUF general.architecture -> canonical name.
MODEL_ALIASES: dict[str, str] = {
    "mistral": "llama",
    "tinyllama": "llama",
    "gemma3_text": "gemma3",
}


def canonical_model_type(name: str) -> str:
    name = MODEL_ALIASES.get(name, name)
    if name not in MODELS:
        raise UnsupportedModelError(f"unsupported model architecture {name!r}")
    return name


def build_model(args: ModelArgs) -> nn.Module:
    return MODELS[canonical_model_type(args.model_type)](args)
