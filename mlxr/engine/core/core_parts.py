"""What a loaded model gives the engine core (CoreParts), and the settings its kind implies: the
features a model with recurrent-state layers runs without, and a drafting step's row count."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from mlxr.config import EngineConfig
from mlxr.engine.kv.cache import KVCache
from mlxr.engine.spec_decode.factory import draft_budget, jumps_forward
from mlxr.engine.worker.model_runner import ModelRunner
from mlxr.errors import InvalidParameterError
from mlxr.model_config import ModelArgs

log = logging.getLogger(__name__)


def drafting_rows(config: EngineConfig, parts) -> int:
    """A drafting step's decode rows at most (a draft token is a row): speculative decoding's
    or jump-forward's, within speculative_max_batch requests unless the device's measured step
    costs plan the drafts (then at any batch)."""
    drafts = config.speculative_method is not None or jumps_forward(config, parts)
    planned = drafts and draft_budget(config, parts.device) is not None
    batch = config.max_num_seqs if planned else min(config.max_num_seqs, config.speculative_max_batch)
    return batch * (1 + config.num_speculative_tokens) if drafts else 0


@dataclass(frozen=True)
class CoreParts:
    """What a loaded model gives the engine: the weights, their shape and placement, and the
    tokenizer (the frontend's, and structured output's vocabulary in the core). A frontend
    whose core runs in another process holds the args and the tokenizer alone."""

    model: torch.nn.Module
    args: ModelArgs
    dtype: torch.dtype
    device: torch.device
    tokenizer: object | None = None  # mlxr.tokenizer.tokenizer.Tokenizer: structured output's vocabulary
    model_digest: str = ""  # what the disk tier keys blocks by (the model's files and load options)
    # A runner of another kind (mlxr/distributed: rank 0 of a tensor-parallel group, which
    # announces every step to its workers); it runs without step overlap.
    make_runner: Callable[[torch.nn.Module, KVCache, torch.device], ModelRunner] | None = None
    draft: "CoreParts | None" = None  # the draft model of speculative_method "draft"
    # (name, path, bounds) -> the adapter in the model's own names (the loader maps GGUF names);
    # None: formats/lora_adapter.read_adapter, PEFT directories as they are.
    read_adapter: Callable | None = None
    # (checkpoint, args) -> the target's MTP layer's tensors by the loader's rules
    # (loader/mtp_weights.read_mtp_tensors); None: a directory's mtp.* tensors as they are.
    read_mtp: Callable | None = None


def stateful_config(config: EngineConfig, parts: CoreParts) -> EngineConfig:
    """A model with recurrent-state layers runs without what needs a state at an arbitrary
    earlier position in the host and disk tiers or captured steps but the CPU's decode graphs (a
    drafted row runs eagerly): not offered for it yet (docs/models.md). Its prefix caching resumes
    from state checkpoints and a swapped request keeps its state in one (sched/state_prefix.py).
    Rejected drafts roll its state back (worker/state_rollback.py); a draft model with such layers
    is refused."""
    if parts.draft is not None and parts.draft.args.linear_attention is not None:
        raise InvalidParameterError("speculative_draft_model", f"{parts.draft.args.model_type} keeps a recurrent "
                                                               "state: not offered as a draft model yet")
    args = parts.args
    if args.linear_attention is None:
        return config
    off = dict(kv_host_cache_gb=0.0, kv_cache_dir=None, enable_cuda_graphs=False, enable_prefill_graphs=False)
    if not config.enable_prefix_caching or config.num_state_checkpoints == 0:
        off["swap_space_gb"] = 0.0  # a swapped request's state is kept in the checkpoint pool
    changed = [k for k, v in off.items() if getattr(config, k) != v]
    if changed:
        log.info("%s keeps a recurrent state per request: %s off", args.model_type, ", ".join(changed))
    return replace(config, **off)
