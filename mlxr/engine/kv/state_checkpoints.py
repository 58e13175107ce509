"""Recurrent-state checkpoints for prefix caching of hybrid models (docs/kv-cache.md): a copy
of every linear-attention layer's conv state and delta-rule state as of a prefix block's last
token, kept beside the state slots (state.py). A request whose prompt matches a cached prefix
resumes from a checkpoint: its K/V blocks are shared as for plain models and the state is copied
from the checkpoint into its slot. Which checkpoint belongs to which block hash is the torch-free
index's business (sched/state_index.py); this pool only holds the tensors and copies them."""
from __future__ import annotations

import torch

from mlxr.config import EngineConfig
from mlxr.engine.kv.state import RecurrentState
from mlxr.model_config import LinearAttentionArgs


def num_checkpoints_for_memory(args: LinearAttentionArgs, gb: float, max_checkpoints: int = 4096) -> int:
    """How many checkpoints `gb` of memory holds (each one sequence's whole state), bounded so a
    large budget never allocates an unbounded pool."""
    return max(0, min(max_checkpoints, int(gb * (1 << 30)) // args.state_bytes_per_sequence()))


def num_state_checkpoints(config: EngineConfig, linear: LinearAttentionArgs | None) -> int:
    """The engine's checkpoints: none without recurrent-state layers or prefix caching; else as
    configured, or an eighth of kv_cache_memory_gb."""
    if linear is None or not config.enable_prefix_caching:
        return 0
    if config.num_state_checkpoints is not None:
        return config.num_state_checkpoints
    return num_checkpoints_for_memory(linear, config.kv_cache_memory_gb / 8)


class StateCheckpoints:
    def __init__(self, state: RecurrentState, num_checkpoints: int) -> None:
        self.num_checkpoints = num_checkpoints
        self.pools: dict[int, tuple[torch.Tensor, torch.Tensor]] = {
            layer: (conv.new_zeros((num_checkpoints, *conv.shape[1:])),
                    delta.new_zeros((num_checkpoints, *delta.shape[1:])))
            for layer, (conv, delta) in state.pools.items()
        }
        self.state = state

    @property
    def nbytes(self) -> int:
        return sum(c.numel() * c.element_size() + d.numel() * d.element_size() for c, d in self.pools.values())

    def save(self, pairs: list[tuple[int, int]]) -> None:
        """(state slot, checkpoint) pairs: keep each slot's state as that checkpoint."""
        self._copy(pairs, self.state.pools, self.pools)

    def restore(self, pairs: list[tuple[int, int]]) -> None:
        """(checkpoint, state slot) pairs: a slot resumes from that checkpoint's state."""
        self._copy(pairs, self.pools, self.state.pools)

    @staticmethod
    def _copy(pairs, src_pools, dst_pools) -> None:
        if not pairs:
            return
        for layer, (src_conv, src_delta) in src_pools.items():
            dst_conv, dst_delta = dst_pools[layer]
            src = torch.tensor([p[0] for p in pairs], device=src_conv.device)
            dst = torch.tensor([p[1] for p in pairs], device=dst_conv.device)
            dst_conv.index_copy_(0, dst, src_conv.index_select(0, src))
            dst_delta.index_copy_(0, dst, src_delta.index_select(0, src))
