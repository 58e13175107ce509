"""The paged KV cache tensors: per layer, K and V of shape [blocks, block_size, kv_heads, head_dim]."""
from __future__ import annotations

import torch

from mlxr.config import ModelArgs


def kv_bytes_per_block(args: ModelArgs, block_size: int, dtype: torch.dtype) -> int:
    per_token = 2 * args.num_hidden_layers * args.num_key_value_heads * args.head_dim
    return per_token * block_size * torch.empty((), dtype=dtype).element_size()


def num_blocks_for_memory(args: ModelArgs, block_size: int, dtype: torch.dtype, gb: float) -> int:
    return max(1, int(gb * (1 << 30)) // kv_bytes_per_block(args, block_size, dtype))


class KVCache:
    def __init__(
        self,
        args: ModelArgs,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_blocks, block_size, args.num_key_value_heads, args.head_dim)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(args.num_hidden_layers)
        ]

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate src blocks into dst blocks in every layer."""
        if not pairs:
            return
        device = self.layers[0][0].device
        src = torch.tensor([p[0] for p in pairs], device=device)
        dst = torch.tensor([p[1] for p in pairs], device=device)
        for k, v in self.layers:
            k.index_copy_(0, dst, k.index_select(0, src))
            v.index_copy_(0, dst, v.index_select(0, src))
