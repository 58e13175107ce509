"""A Hugging Face model directory -> model args, weights and tokenizer."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from dataclasses import replace

from mlxr.errors import UnsupportedModelError
from mlxr.formats.hf_preprocess import preprocess_from_hf
from mlxr.formats.json_file import check_text_file, read_json_object
from mlxr.formats.limits import check_layers_present
from mlxr.formats.safetensors_dir import iter_safetensors, tensor_names
from mlxr.formats.sentence_config import read_sentence_config
from mlxr.loader.experts import stack_experts
from mlxr.loader.unfuse import split_fused
from mlxr.model_config import ModelArgs, VisionArgs
from mlxr.models import architecture, hf_architecture
from mlxr.models.model_args import args_from_hf
from mlxr.models.qwen3_reranker import KIND as QWEN3_RERANKER
from mlxr.models.qwen3_reranker import is_qwen3_reranker
from mlxr.tokenizer.tokenizer import Tokenizer

# Multimodal checkpoints nest the text model; only its weights are ours.
PREFIX_REWRITES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.text_model.", "model."),  # Idefics3 / SmolVLM
    # A bare backbone (sentence-transformers saves AutoModel: Qwen3-Embedding's checkpoint)
    ("layers.", "model.layers."),
    ("embed_tokens.", "model.embed_tokens."),
    ("norm.", "model.norm."),
)
MTP_PREFIX = "mtp."
SKIPPED_PREFIXES = ("vision_tower.", "model.vision_tower.", "model.visual.", "visual.", "multi_modal_projector.", "model.multi_modal_projector.",
                    "model.vision_model.", "model.connector.")


def read_config(model_dir: Path) -> dict:
    return read_json_object(model_dir / "config.json", 16 << 20)


def read_hf_dir(model_dir: Path) -> tuple[ModelArgs, Iterator[tuple[str, torch.Tensor]], Tokenizer]:
    config = read_config(model_dir)
    args = with_sentence_pooling(with_vision(args_from_hf(config), config, model_dir), model_dir)
    names = [n for n in map(hf_name, tensor_names(model_dir)) if n is not None]
    check_layers_present(args.num_hidden_layers, names, "model.layers.", "the checkpoint")
    check_text_file(model_dir / "chat_template.jinja")  # the tokenizer reads it whole
    tokenizer = Tokenizer.from_hf_dir(model_dir)
    return args, _weights(model_dir, args), tokenizer


def with_vision(args: ModelArgs, config: dict, model_dir: Path) -> ModelArgs:
    """A multimodal config whose architecture has a tower: its VisionArgs, preprocessing read
    from preprocessor_config.json (transformers' defaults for the tower's size where absent)."""
    arch = hf_architecture(config)
    if arch.hf_vision is None or not isinstance(config.get("vision_config"), dict):
        return args
    fields = arch.hf_vision(config)
    path = model_dir / "preprocessor_config.json"
    pre = read_json_object(path, 1 << 20) if path.is_file() else {}
    factor = fields["patch_size"] * fields["scale_factor"] if fields["tower"] == "qwen2_5_vl" else 0
    preprocess = preprocess_from_hf(pre, fields["image_size"], tiled=fields.get("tiled", False), resize_factor=factor)
    return replace(args, vision=VisionArgs(**fields, preprocess=preprocess))


def vision_name(name: str) -> str | None:
    """A tower or projector tensor's parameter name in a vision-language model (None: unused)."""
    for prefix in ("model.vision_tower.", "vision_tower.", "model.vision_model."):
        if name.startswith(prefix):
            rest = name[len(prefix):].removeprefix("vision_model.")
            return None if rest.startswith("head.") else "vision_tower." + rest
    for prefix in ("model.visual.", "visual."):  # Qwen2.5-VL: tower and merger in one module
        if name.startswith(prefix):
            return "visual." + name[len(prefix):]
    for prefix in ("model.multi_modal_projector.", "multi_modal_projector.", "model.connector."):
        if name.startswith(prefix):
            return "multi_modal_projector." + name[len(prefix):]
    return name


def with_sentence_pooling(args: ModelArgs, model_dir: Path) -> ModelArgs:
    """A decoder embedding model's pooling (Qwen3-Embedding: last token) from its
    sentence-transformers files, for the engine's embeddings (none: mean); and a decoder
    reranker's kind (Qwen3-Reranker)."""
    sentence = read_sentence_config(model_dir)
    if sentence.dense:
        raise UnsupportedModelError("sentence-transformers Dense modules after a decoder's pooling are not supported")
    pooling = sentence.pooling
    extra = {**args.extra, "pooling": pooling} if pooling else dict(args.extra)
    if is_qwen3_reranker(model_dir, args.extra.get("hf_model_type")):
        extra["reranker"] = QWEN3_RERANKER
    return replace(args, extra=extra)


def hf_name(name: str, vision: bool = False) -> str | None:
    if name.startswith(MTP_PREFIX):  # a multi-token-prediction layer: the mtp proposer reads it (spec_decode/mtp.py)
        return None
    if name.startswith(SKIPPED_PREFIXES):
        return vision_name(name) if vision else None
    for old, new in PREFIX_REWRITES:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def to_torch(array: np.ndarray, dtype: str = "F32") -> torch.Tensor:
    if dtype == "BF16":  # raw bits from the safetensors reader
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


def _weights(model_dir: Path, args: ModelArgs) -> Iterator[tuple[str, torch.Tensor]]:
    transform = architecture(args.model_type).checkpoint_tensors
    tensors = _checkpoint_tensors(model_dir, args)
    return stack_experts(tensors if transform is None else transform(tensors), args)


def _checkpoint_tensors(model_dir: Path, args: ModelArgs) -> Iterator[tuple[str, torch.Tensor]]:
    from mlxr.loader.bnb_nf4 import group_nf4, nf4_bases

    tensors = iter_safetensors(model_dir)
    bases = nf4_bases(tensor_names(model_dir))
    vision = args.vision is not None
    for raw in group_nf4(tensors, bases) if bases else tensors:
        if isinstance(raw, tuple):  # a bitsandbytes 4-bit weight, kept 4-bit
            name = hf_name(raw[0], vision)
            if name is not None:
                yield name, raw[1]
            continue
        name = hf_name(raw.name, vision)
        if name is not None:
            yield from split_fused(name, to_torch(raw.array, raw.dtype), args)
