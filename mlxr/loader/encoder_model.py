"""An encoder (embedding or reranking model) on disk -> model, tokenizer and its pooling: from
an HF directory (sentence-transformers' modules.json says the pooling) or from the GGUF
llama.cpp's converter writes (`<arch>.pooling_type`; its tensor names are mapped back)."""
from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mlxr.errors import ModelFormatError
from mlxr.formats.gguf import GGUFFile, open_gguf
from mlxr.formats.safetensors_dir import iter_safetensors
from mlxr.formats.sentence_config import read_sentence_config
from mlxr.loader.hf_model import read_config, to_torch
from mlxr.loader.resolve import ModelSource, resolve_model
from mlxr.model_config import ModelArgs
from mlxr.models import ENCODERS, MODELS, architecture, canonical_model_type, gemma_embedding, hf_architecture, nomic_bert
from mlxr.models.bert import GGUF_TENSORS, HF_PREFIXES, HF_RENAMES
from mlxr.models.model_args import args_from_gguf, args_from_hf
from mlxr.models.pooling import PooledHead
from mlxr.tokenizer.tokenizer import Tokenizer

# Checkpoint tensors an encoder never uses: the masked-LM and next-sentence heads, position ids.
_UNUSED = ("cls.predictions.", "cls.seq_relationship.", "lm_head.", "embeddings.position_ids")
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


@dataclass
class LoadedEncoder:
    source: ModelSource
    args: ModelArgs
    model: nn.Module
    tokenizer: Tokenizer
    pooling: str  # the model's own: "mean" | "cls" | "last" | "rank" (a cross-encoder's score)
    normalize: bool  # the model's embeddings are L2-normalised (sentence-transformers' Normalize)
    dtype: torch.dtype
    device: torch.device


def source_is_encoder(source: ModelSource) -> bool:
    """Whether a resolved model is an encoder, from its config.json or GGUF metadata alone."""
    try:
        if source.format == "gguf":
            with open_gguf(source.path) as f:
                name = f.metadata.get("general.architecture")
            return isinstance(name, str) and architecture(name).name in ENCODERS
        return hf_architecture(read_config(source.path)).name in ENCODERS
    except Exception:  # noqa: BLE001 - an unknown architecture is the decoder loader's error to name
        return False


def load_encoder(ref: str, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> LoadedEncoder:
    """fp32 unless told: an encoder's cost is its matmuls over whole inputs, and fp32 keeps
    its vectors equal to the reference's."""
    source = resolve_model(ref)
    dtype = dtype or torch.float32
    device = torch.device(device) if device is not None else torch.device("cpu")
    if source.format == "gguf":
        args, weights, tokenizer, pooling, normalize, head = _read_gguf(source.path)
    else:
        args, weights, tokenizer, pooling, normalize, head = _read_hf(source.path)
    args = replace(args, model_type=canonical_model_type(args.model_type))
    model = _materialize(args, weights, dtype, device, head)
    return LoadedEncoder(source, args, model, tokenizer, pooling, normalize, dtype, device)


def _read_hf(root: Path):
    config = read_config(root)
    args = args_from_hf(config)
    sentence = read_sentence_config(root)
    pooling = "rank" if args.extra.get("num_labels") else sentence.pooling or "cls"
    head = [(d.in_features, d.out_features, d.bias, d.activation) for d in sentence.dense]
    weights = itertools.chain(_hf_weights(root, args), _dense_weights(root, sentence.dense))
    return args, weights, Tokenizer.from_hf_dir(root), pooling, sentence.normalize, head


def _dense_weights(root: Path, modules) -> Iterator[tuple[str, torch.Tensor]]:
    """A Dense module's `linear.weight` / `linear.bias` -> pooled_head.{j}.*"""
    for j, module in enumerate(modules):
        for raw in iter_safetensors(root / module.path):
            kind = raw.name.removeprefix("linear.")
            yield f"pooled_head.{j}.{kind}", to_torch(raw.array, raw.dtype)


# Architectures whose checkpoint names differ from BERT's: name -> ours (None: unused)
_HF_NAMES = {nomic_bert.ARCH.name: nomic_bert.hf_name, gemma_embedding.ARCH.name: gemma_embedding.hf_name}


def _hf_weights(root: Path, args: ModelArgs) -> Iterator[tuple[str, torch.Tensor]]:
    offset = args.extra.get("position_offset", 0)
    rename = _HF_NAMES.get(canonical_model_type(args.model_type))
    for raw in iter_safetensors(root):
        name = rename(raw.name) if rename else hf_encoder_name(raw.name, bool(args.extra.get("num_labels")))
        if name is None:
            continue
        tensor = to_torch(raw.array, raw.dtype)
        if name == "embeddings.position_embeddings.weight" and offset:
            tensor = tensor[offset:]
        yield from nomic_bert.split_fused(name, tensor)


def hf_encoder_name(name: str, classifier: bool) -> str | None:
    """A checkpoint name -> our parameter name, None for a tensor the encoder does not use."""
    for prefix in HF_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if name.startswith(_UNUSED) or (not classifier and name.startswith(("pooler.", "classifier."))):
        return None
    for old, new in HF_RENAMES.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _read_gguf(path: Path):
    f = open_gguf(path)
    args = args_from_gguf(f)
    if "cls.output.weight" in f:
        extra = {**args.extra, "num_labels": f.tensor_info("cls.output.weight").shape[0],
                 "classifier_dense": "cls.weight" in f}
        args = replace(args, extra=extra)
    pooling = "rank" if args.extra.get("num_labels") else args.extra.get("pooling") or "cls"
    if pooling == "none":
        raise ModelFormatError(f"{path.name}: pooling_type none gives no vector per input; serve it with "
                               "--pooling mean, cls or last")
    # llama.cpp normalises embeddings by default (--embd-normalize 2); so does its server
    arch = f.metadata.get("general.architecture")
    tensors = _GGUF_TENSORS.get(arch, GGUF_TENSORS)
    head = [(*reversed(f.tensor_info(f"{d}.weight").shape), False, "identity")
            for d in ("dense_2", "dense_3") if f"{d}.weight" in f]
    weights = _gguf_weights(f, tensors, arch == "gemma-embedding")
    return args, weights, Tokenizer.from_gguf_metadata(f.metadata), pooling, True, head


_GGUF_TENSORS = {"nomic-bert": nomic_bert.GGUF_TENSORS, "gemma-embedding": gemma_embedding.GGUF_TENSORS}


def _gguf_weights(f: GGUFFile, tensors: dict[str, str], norm_plus_one: bool) -> Iterator[tuple[str, torch.Tensor]]:
    with f:
        for name in f.tensor_names:
            tensor = torch.from_numpy(np.ascontiguousarray(f.load(name)))
            ours = gguf_encoder_name(name, tensors)
            if norm_plus_one and ours.endswith(gemma_embedding.GGUF_NORMS_WEIGHT):
                tensor = tensor - 1  # llama.cpp's converter stores Gemma's norms as 1 + w
            yield from nomic_bert.split_fused(ours, tensor)


def gguf_encoder_name(name: str, tensors: dict[str, str] = GGUF_TENSORS) -> str:
    base, _, kind = name.rpartition(".")
    layer = _LAYER.match(base)
    key, index = (f"blk.{{i}}.{layer.group(2)}", layer.group(1)) if layer else (base, None)
    target = tensors.get(key)
    if target is None or kind not in ("weight", "bias"):
        raise ModelFormatError(f"unexpected tensor {name!r} in the GGUF file")
    return f"{target.format(i=index)}.{kind}"


def _materialize(args: ModelArgs, weights, dtype: torch.dtype, device: torch.device, head) -> nn.Module:
    with torch.device("meta"):
        model = MODELS[architecture(args.model_type).name](args)
        if head:
            model.pooled_head = PooledHead(head)
    expected = dict(model.named_parameters())
    state: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if name not in expected:
            raise ModelFormatError(f"unexpected tensor {name!r} in the checkpoint")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ModelFormatError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected "
                                   f"{tuple(expected[name].shape)}")
        state[name] = tensor.to(device=device, dtype=dtype)
    missing = [n for n in expected if n not in state]
    if missing:
        raise ModelFormatError(f"the checkpoint lacks tensors: {', '.join(missing[:5])}")
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()
