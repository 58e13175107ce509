"""Mistral: the Llama anatomy with a sliding window on every layer (config.json sliding_window).

llama.cpp converts Mistral checkpoints to GGUF architecture "llama" and writes no window, so
such a GGUF attends over the full context (as llama.cpp does); a `llama.attention.sliding_window`
key, where a file has one, is honoured (formats/gguf_config.py)."""
from __future__ import annotations

from mlxr.models.arch import Architecture
from mlxr.models.llama import LlamaForCausalLM

MODEL = LlamaForCausalLM
ARCH = Architecture("mistral", ("mistral",), (), gguf_permuted_qk=True, hf_max_positions=131072)
