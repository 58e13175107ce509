"""Qwen2: the Llama anatomy with a bias on the q/k/v projections (ModelArgs.attention_bias)."""
from __future__ import annotations

from mlxr.config import ModelArgs
from mlxr.models.arch import Architecture
from mlxr.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    def __init__(self, args: ModelArgs) -> None:
        assert args.attention_bias, "qwen2 checkpoints carry q/k/v biases"
        super().__init__(args)


MODEL = Qwen2ForCausalLM
ARCH = Architecture("qwen2", ("qwen2",), ("qwen2",))
