"""File on disk -> (model, tokenizer, args): the one place that knows both formats and models."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from mlxr.config import ModelArgs
from mlxr.errors import ModelFormatError
from mlxr.loader.resolve import ModelSource, resolve_model
from mlxr.loader.tokenizer import Tokenizer
from mlxr.models import build_model, canonical_model_type

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    source: ModelSource
    args: ModelArgs
    model: nn.Module
    tokenizer: Tokenizer
    dtype: torch.dtype
    device: torch.device


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def default_device() -> torch.device:
    return torch.device("cpu")


def to_torch(array: np.ndarray, dtype: str = "F32") -> torch.Tensor:
    if dtype == "BF16":  # raw bits from the safetensors reader
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


def load_model(
    ref: str, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> LoadedModel:
    source = resolve_model(ref)
    device = torch.device(device) if device is not None else default_device()
    dtype = dtype or default_dtype(device)
    if source.format == "gguf":
        from mlxr.loader.gguf_model import read_gguf

        args, weights, tokenizer = read_gguf(source.path)
    else:
        from mlxr.loader.hf_model import read_hf_dir

        args, weights, tokenizer = read_hf_dir(source.path)
    args = _with_canonical_type(args)
    model = materialize(args, weights, dtype, device)
    log.info("loaded %s (%s, %s) on %s as %s", ref, source.format, args.model_type, device, dtype)
    return LoadedModel(source, args, model, tokenizer, dtype, device)


def _with_canonical_type(args: ModelArgs) -> ModelArgs:
    from dataclasses import replace

    return replace(args, model_type=canonical_model_type(args.model_type))


def materialize(args: ModelArgs, weights, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """Build the model without allocating random weights, then assign the checkpoint's."""
    with torch.device("meta"):
        model = build_model(args)
    expected = dict(model.named_parameters())
    state: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if name not in expected:
            if args.tie_word_embeddings and name == "lm_head.weight":
                continue
            raise ModelFormatError(f"unexpected tensor {name!r} in the checkpoint")
        want = tuple(expected[name].shape)
        if tuple(tensor.shape) != want:
            raise ModelFormatError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {want}")
        state[name] = tensor.to(device=device, dtype=dtype)
    missing = [n for n in expected if n not in state and not _is_tied(args, n)]
    if missing:
        raise ModelFormatError(f"the checkpoint lacks tensors: {', '.join(missing[:5])}")
    model.load_state_dict(state, strict=False, assign=True)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for module in model.modules():
        if hasattr(module, "reset_buffers"):
            module.reset_buffers(device)
    return model.eval()


def _is_tied(args: ModelArgs, name: str) -> bool:
    return args.tie_word_embeddings and name == "lm_head.weight"
