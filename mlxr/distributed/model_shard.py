"""Load a model and keep one rank's share. The whole model is read into host memory, cut, and
only the share moves to the rank's device: a model too large for one GPU still loads."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import torch
from torch import nn

from mlxr.distributed.parallel_state import TPGroup
from mlxr.distributed.sharding import shard_model
from mlxr.layers.fused_linear import fuse_projections
from mlxr.loader import default_dtypes, load_model
from mlxr.model_config import ModelArgs
from mlxr.models import build_model

# A model reference "random:<ModelArgs as JSON>": a shape model with random weights, each rank
# drawing only its own share on its device (benchmarks of models larger than one device).
RANDOM_PREFIX = "random:"

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelShard:
    model: nn.Module
    args: ModelArgs  # the whole model's
    local_args: ModelArgs  # this rank's heads: what its KV cache holds
    dtype: torch.dtype


def load_shard(spec: dict[str, str | None], group: TPGroup) -> ModelShard:
    """spec: ModelSpec.as_strings() of the model to load."""
    target = group.device
    default_act, default_weights = default_dtypes(target)
    dtype = DTYPES.get(spec.get("dtype") or "", None)
    weight_dtype = DTYPES.get(spec.get("weight_dtype") or "", None) or dtype or default_weights
    dtype = dtype or default_act
    if spec["ref"].startswith(RANDOM_PREFIX):
        args = msgspec.json.decode(spec["ref"].removeprefix(RANDOM_PREFIX), type=ModelArgs)
        cut: dict[str, ModelArgs] = {}
        model = random_model(args, dtype, target, lambda m: cut.setdefault("args", shard_model(m, args, group)),
                             seed=group.rank)
        return ModelShard(model, args, cut["args"], dtype)
    fp8 = spec.get("quantization") == "fp8"
    loaded = load_model(spec["ref"], dtype=dtype, device="cpu", weight_dtype=weight_dtype,
                        quantization="none" if fp8 else spec.get("quantization"))
    model = loaded.model
    local_args = shard_model(model, loaded.args, group)
    model.to(target)
    if fp8:  # per-channel scales of each rank's share: quantized after the cut
        from mlxr.layers.fp8_linear import store_weights_fp8

        # the backbone only: the lm_head (now inside its vocab-parallel wrapper) stays 16-bit
        store_weights_fp8(model.model, check_device=target.type == "cuda")
    log.info("rank %d holds %s: %d of %d heads, %d KV heads", group.rank, spec["ref"],
             local_args.num_attention_heads, loaded.args.num_attention_heads, local_args.num_key_value_heads)
    return ModelShard(model, loaded.args, local_args, dtype)


def random_model(args: ModelArgs, dtype: torch.dtype, device: torch.device,
                 cut: Callable[[nn.Module], object] | None = None, seed: int = 0) -> nn.Module:
    """The architecture of `args` with N(0, 0.02) matrices and unit norms, built on the meta
    device, cut (a rank's share) before any memory is taken, then drawn on `device`."""
    with torch.device("meta"):
        model = build_model(args)
    fuse_projections(model)
    if cut is not None:
        cut(model)
    model.to(dtype).to_empty(device=device)
    gen = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    for m in model.modules():
        if hasattr(m, "reset_buffers"):
            m.reset_buffers(device)
    return model.eval()
