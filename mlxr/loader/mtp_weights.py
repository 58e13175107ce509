"""An MTP layer's tensors for the mtp proposer (spec_decode/mtp.py, through CoreParts.read_mtp),
named as MTPLayer's parameters (fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm, layers.0.*),
from either place a checkpoint keeps them:

- a Hugging Face directory: the `mtp.*` tensors (Qwen3-Next's and Qwen3.5's layout). The block's
  tensors go through the target's own loading rules (fused tensors split, per-expert tensors
  stacked) as if they were one more layer of the target, so a MoE target's MTP block loads as its
  layers do;
- a GGUF file from llama.cpp's converter: the layers past the model's own
  (`{arch}.nextn_predict_layers`), `blk.N.nextn.{eh_proj,enorm,hnorm,shared_head_norm}` and the
  block's tensors under the target's names, its converter changes undone as for the target."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from mlxr.errors import ModelFormatError
from mlxr.formats.gguf import open_gguf
from mlxr.formats.safetensors_dir import iter_safetensors
from mlxr.loader.experts import stack_experts
from mlxr.loader.gguf_weights import hf_name as gguf_hf_name
from mlxr.loader.gguf_weights import to_hf_layout
from mlxr.loader.hf_model import MTP_PREFIX, to_torch
from mlxr.loader.unfuse import split_fused
from mlxr.model_config import ModelArgs

_BLOCK = "layers.0."
# llama.cpp's nextn names -> MTPLayer's (the converter's remapper in conversion/qwen.py, reversed).
_NEXTN = {"eh_proj": "fc", "enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden",
          "shared_head_norm": "norm"}


def read_mtp_tensors(source: str | Path, target: ModelArgs) -> dict[str, torch.Tensor]:
    """MTPLayer's tensors from a checkpoint directory or a GGUF file."""
    path = Path(source)
    if path.is_file():
        return _from_gguf(path, target)
    tensors = mtp_tensors(path)
    if not tensors:
        raise ModelFormatError(f"{path} holds no {MTP_PREFIX}* tensors: the checkpoint has no MTP layer")
    _check_one_layer({n.split(".")[1] for n in tensors if n.startswith("layers.")})
    return _as_target_layer(tensors, target)


def mtp_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """A directory's `mtp.*` tensors (prefix removed)."""
    return {raw.name[len(MTP_PREFIX):]: to_torch(raw.array, raw.dtype) for raw in iter_safetensors(model_dir)
            if raw.name.startswith(MTP_PREFIX)}


def _check_one_layer(layers: set[str]) -> None:
    extra = sorted(layers - {"0"})
    if extra:
        raise ModelFormatError(f"MTP layers {', '.join(extra)}: only one MTP layer (layers.0) is supported")


def _as_target_layer(tensors: dict[str, torch.Tensor], target: ModelArgs) -> dict[str, torch.Tensor]:
    """The block's tensors through the target's rules, as its layer num_hidden_layers."""
    layer = f"model.layers.{target.num_hidden_layers}."
    block = [(layer + n[len(_BLOCK):], t) for n, t in tensors.items() if n.startswith(_BLOCK)]
    out = {n: t for n, t in tensors.items() if not n.startswith(_BLOCK)}
    split = (part for name, t in block for part in split_fused(name, t, target))
    for name, t in stack_experts(split, target):
        out[_BLOCK + name.removeprefix(layer)] = t
    return out


def _from_gguf(path: Path, target: ModelArgs) -> dict[str, torch.Tensor]:
    n_layers, extra = target.num_hidden_layers, target.extra.get("nextn_layers", 0)
    if not extra:
        raise ModelFormatError(f"{path.name} has no nextn_predict_layers: the GGUF holds no MTP layer "
                               "(converted with --no-mtp?)")
    _check_one_layer({str(i - n_layers) for i in range(n_layers, n_layers + extra)})
    prefix, out = f"blk.{n_layers}.", {}
    # The block's tensors named as layer 0's of a one-layer model (the name table's bound), then
    # laid out as the target's own.
    one = _one_layer_args(target)
    with open_gguf(path) as f:
        for name in f.tensor_names:
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix):]
            if rest.startswith("nextn."):
                base, _, suffix = rest[len("nextn."):].rpartition(".")
                if base not in _NEXTN or suffix != "weight":
                    raise ModelFormatError(f"GGUF tensor {name!r}: an MTP tensor MLXR does not use")
                # The layout rules see the name the converter changed it under (enorm, hnorm,
                # shared_head.norm: norms, stored 1 + w for Qwen3.5).
                converted = f"model.layers.0.{base}.weight"
                out[f"{_NEXTN[base]}.weight"] = _tensor(to_hf_layout(converted, f.load(name), one))
                continue
            hf = gguf_hf_name("blk.0." + rest, one)
            if hf is None:
                continue
            for part, array in split_fused(hf, to_hf_layout(hf, f.load(name), one), one):
                out[_BLOCK + part.removeprefix("model.layers.0.")] = _tensor(array)
    return out


def _one_layer_args(target: ModelArgs) -> ModelArgs:
    la = target.linear_attention
    one = replace(la, layers=(False,)) if la is not None else None
    return replace(target, num_hidden_layers=1, linear_attention=one, extra={**target.extra, "nextn_layers": 0})


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))
