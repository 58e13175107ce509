"""A GGUF file -> model args, HF-named weights and the embedded tokenizer."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from mlxr.config import ModelArgs
from mlxr.formats.gguf import GGUFFile, open_gguf
from mlxr.formats.gguf_config import args_from_gguf_file
from mlxr.loader.gguf_weights import iter_gguf_hf_weights
from mlxr.loader.tokenizer import Tokenizer


def read_gguf(path: Path) -> tuple[ModelArgs, Iterator[tuple[str, torch.Tensor]], Tokenizer]:
    f = open_gguf(path)
    args = args_from_gguf_file(f)
    tokenizer = Tokenizer.from_gguf_metadata(f.metadata)
    return args, _weights(f, args), tokenizer


def _weights(f: GGUFFile, args: ModelArgs) -> Iterator[tuple[str, torch.Tensor]]:
    with f:
        for name, array in iter_gguf_hf_weights(f, args):
            yield name, torch.from_numpy(array)
