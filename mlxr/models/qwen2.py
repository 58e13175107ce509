"""Qwen2: the Llama anatomy with a bias on the q/k/v projections (ModelArgs.attention_bias)."""
from __future__ import annotations

from typing import Any

from mlxr.formats.hf_config import sliding_from_config
from mlxr.model_config import ModelArgs
from mlxr.models.arch import Architecture
from mlxr.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    def __init__(self, args: ModelArgs) -> None:
        assert args.attention_bias, "qwen2 checkpoints carry q/k/v biases"
        super().__init__(args)


def _biased(_: Any) -> dict[str, Any]:
    return {"attention_bias": True}  # whatever config.json or the GGUF file says


def _hf_sliding(cfg: dict, layers: int) -> tuple[int | None, tuple[bool, ...]]:
    """Windows only with use_sliding_window true, on the layers from max_window_layers on."""
    return sliding_from_config(cfg, layers, flag_rules=True)


MODEL = Qwen2ForCausalLM
ARCH = Architecture("qwen2", ("qwen2",), ("qwen2",), hf_fields=_biased, hf_sliding=_hf_sliding,
                    hf_max_positions=32768, gguf_fields=_biased)
