"""A GGUF file -> model args, HF-named weights and the embedded tokenizer."""
from __future__ import annotations

import logging
from collections.abc import Collection, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from mlxr.formats.gguf import GGUFFile, open_gguf
from mlxr.layers.quant_linear import PackedWeight
from mlxr.loader.gguf_weights import dequantized_types, iter_gguf_hf_tensors
from mlxr.loader.rank_head import answer_rows, is_rank_model, untied_head
from mlxr.loader.unfuse import split_fused
from mlxr.model_config import ModelArgs
from mlxr.models.model_args import args_from_gguf
from mlxr.models.qwen3_reranker import KIND as QWEN3_RERANKER
from mlxr.ops.quant.block_types import KEPT_TYPES
from mlxr.tokenizer.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def read_gguf(
    path: Path, keep_quantized: bool = False, kept: Collection[str] = KEPT_TYPES
) -> tuple[ModelArgs, Iterator[tuple[str, torch.Tensor | PackedWeight]], Tokenizer]:
    """The model's shape, its weights as they load (the GGUF types in `kept` stay quantized
    when keep_quantized), and its tokenizer."""
    f = open_gguf(path)
    args = args_from_gguf(f)
    tokenizer = Tokenizer.from_gguf_metadata(f.metadata)
    expanded = dequantized_types(f, keep_quantized, kept)
    if expanded:
        log.info("%s: dequantizing at load %s", path.name,
                 ", ".join(f"{n} {t} tensors" for t, n in sorted(expanded.items())))
    weights = _weights(f, args, keep_quantized, kept)
    if is_rank_model(f):
        head = untied_head(f, answer_rows(f, tokenizer.token_to_id))
        args = replace(args, extra={**args.extra, "reranker": QWEN3_RERANKER})
        if head is not None:
            weights = _with_head(weights, torch.from_numpy(head))
            args = replace(args, tie_word_embeddings=False)
    return args, weights, tokenizer


def _with_head(weights, head: torch.Tensor):
    yield from weights
    yield "lm_head.weight", head


def _weights(f: GGUFFile, args: ModelArgs, keep_quantized: bool,
             kept: Collection[str]) -> Iterator[tuple[str, torch.Tensor | PackedWeight]]:
    with f:
        for name, target, whole, qtype in iter_gguf_hf_tensors(f, args, keep_quantized, kept):
            for part, array in split_fused(target, whole, args):  # quantized blocks split by rows too
                tensor = torch.from_numpy(np.ascontiguousarray(array))
                shape = (array.shape[0], *f.tensor_info(name).shape[1:])
                yield part, tensor if qtype is None else PackedWeight(tensor, qtype, shape)
