"""ModelArgs of a checkpoint, read with its architecture's declaration (for loader, registry, server)."""
from __future__ import annotations

from mlxr.formats.gguf import GGUFFile
from mlxr.formats.gguf_config import args_from_gguf_file
from mlxr.formats.hf_config import args_from_hf_config
from mlxr.model_config import ModelArgs
from mlxr.models import gguf_architecture, hf_architecture


def args_from_hf(config: dict) -> ModelArgs:
    return args_from_hf_config(config, hf_architecture(config))


def args_from_gguf(f: GGUFFile) -> ModelArgs:
    return args_from_gguf_file(f, gguf_architecture(f.metadata))
