"""Per-expert checkpoint tensors -> one stacked [E, ...] parameter (Architecture.checkpoint_name)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from mlxr.errors import ModelFormatError
from mlxr.model_config import ModelArgs
from mlxr.models import architecture


def stack_experts(weights: Iterable[tuple[str, torch.Tensor]], args: ModelArgs) -> Iterator[tuple[str, torch.Tensor]]:
    """Renames every tensor as the architecture says; a stacked parameter is yielded once all
    of its experts were seen (at most one layer's experts are held at a time in file order)."""
    rename = architecture(args.model_type).checkpoint_name
    pending: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in weights:
        target, expert = rename(name)
        if expert is None:
            yield target, tensor
            continue
        if not 0 <= expert < args.num_experts:
            raise ModelFormatError(f"tensor {name!r} names expert {expert} of {args.num_experts}")
        group = pending.setdefault(target, {})
        if expert in group:
            raise ModelFormatError(f"tensor {name!r} appears twice")
        group[expert] = tensor
        if len(group) == args.num_experts:
            yield target, torch.stack([group[i] for i in range(args.num_experts)])
            del pending[target]
    if pending:
        target, group = next(iter(pending.items()))
        raise ModelFormatError(f"the checkpoint has {len(group)} of {args.num_experts} experts for {target!r}")
