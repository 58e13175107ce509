"""The paged KV cache tensors: per attention layer, K and V of shape [blocks, block_size, kv_heads,
width], views of one tensor (width is head_dim for float formats, the packed row's bytes for q8_0,
q4_0 and fp8: ops/attention/kv_quant.py); and, for a model with recurrent-state layers, their
state slots (state.py). `model_layers` is what the model's forward takes: per layer its K/V or its
state pools."""
from __future__ import annotations

import torch

from mlxr.engine.kv.state import RecurrentState
from mlxr.model_config import ModelArgs
from mlxr.ops.attention.kv_quant import PACKED, check_kv_dtype, row_bytes, row_width, storage_dtype


def resolve_kv_dtype(name: str, head_dim: int) -> str:
    """The engine's KV format from --kv-cache-dtype ("auto": the model's dtype); ValueError for
    an unknown name or a packed format the head dim does not fit."""
    return check_kv_dtype(name, head_dim)


def kv_layout_dtype(kv_dtype: str, dtype: torch.dtype) -> str:
    """The dtype the disk tier's layout (and each block file) records: a float cache its torch
    dtype's name (the one "auto" had), a packed one its format, so blocks of another format are
    another layout's files, never read as this one's."""
    return kv_dtype if kv_dtype in PACKED else str(storage_dtype(kv_dtype, dtype)).removeprefix("torch.")


def attention_layers(args: ModelArgs) -> list[int]:
    """The layers that keep K/V (all but recurrent-state layers)."""
    linear = args.linear_attention.layers if args.linear_attention is not None else ()
    return [i for i in range(args.num_hidden_layers) if not (linear and linear[i])]


def kv_bytes_per_block(args: ModelArgs, block_size: int, dtype: torch.dtype, kv_dtype: str = "auto") -> int:
    """A block's bytes over every attention layer's K and V, for model dtype `dtype` and KV format kv_dtype."""
    rows = 2 * len(attention_layers(args)) * args.num_key_value_heads * block_size
    return rows * row_bytes(kv_dtype, args.head_dim, dtype)


def num_blocks_for_memory(args: ModelArgs, block_size: int, dtype: torch.dtype, gb: float,
                          kv_dtype: str = "auto") -> int:
    return max(1, int(gb * (1 << 30)) // kv_bytes_per_block(args, block_size, dtype, kv_dtype))


class KVCache:
    def __init__(
        self,
        args: ModelArgs,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        num_host_blocks: int = 0,
        kv_dtype: str = "auto",
        num_state_slots: int = 0,
    ) -> None:
        """num_state_slots: recurrent-state slots (the engine's max_num_seqs) where the model has
        such layers (float32 whatever kv_dtype says)."""
        shape = (num_blocks, block_size, args.num_key_value_heads, row_width(kv_dtype, args.head_dim))
        dtype = storage_dtype(kv_dtype, dtype)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.kv_dtype = kv_dtype
        # Every layer's K and V in one tensor [layers, K|V, blocks, ...]: the KV tiers move a block
        # of every layer in one call (kv/tiers.py); each layer's K and V are contiguous views.
        kv_layers = attention_layers(args)
        self.blocks = torch.zeros((len(kv_layers), 2, *shape), dtype=dtype, device=device)
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [(kv[0], kv[1]) for kv in self.blocks]
        self.state: RecurrentState | None = None
        self.checkpoints = None  # hybrid prefix caching: state_checkpoints.StateCheckpoints
        self.model_layers: list[tuple[torch.Tensor, torch.Tensor]] = self.layers
        if args.linear_attention is not None:
            self.state = RecurrentState(args.linear_attention, max(1, num_state_slots), device)
            by_layer = dict(zip(kv_layers, self.layers)) | self.state.pools
            self.model_layers = [by_layer[i] for i in range(args.num_hidden_layers)]
        host_shape = (num_host_blocks, *shape[1:])
        pin = device.type == "cuda"
        self.host_layers: list[tuple[torch.Tensor, torch.Tensor]] = [
            (torch.zeros(host_shape, dtype=dtype, pin_memory=pin), torch.zeros(host_shape, dtype=dtype, pin_memory=pin))
            for _ in range(len(kv_layers) if num_host_blocks else 0)
        ]

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy (device block, host block) pairs from the device cache to host memory."""
        self._transfer(pairs, self.layers, self.host_layers)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy (host block, device block) pairs back to the device cache."""
        self._transfer(pairs, self.host_layers, self.layers)

    @staticmethod
    def _transfer(pairs, src_layers, dst_layers) -> None:
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs])
        dst = torch.tensor([p[1] for p in pairs])
        for (sk, sv), (dk, dv) in zip(src_layers, dst_layers):
            dk.index_copy_(0, dst.to(dk.device), sk.index_select(0, src.to(sk.device)).to(dk.device))
            dv.index_copy_(0, dst.to(dv.device), sv.index_select(0, src.to(sv.device)).to(dv.device))

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
