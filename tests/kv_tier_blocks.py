"""A small random KV cache and its disk tier, shared by the tier-copy, disk-read and hostile
block-file tests (one module at tests/ root: test folders do not import each other)."""
from __future__ import annotations

import functools

import pytest
import torch

from mlxr.engine.kv.block_file import BlockIdentity
from mlxr.engine.kv.cache import KVCache, kv_bytes_per_block
from mlxr.engine.kv.disk import DiskStore, Layout
from mlxr.engine.kv.tiers import KVTiers
from mlxr.engine.sched.block_manager import block_hash
from mlxr.model_config import ModelArgs

ARGS = ModelArgs("llama", 64, 32, 64, 3, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
BLOCK_SIZE = 4
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SIZE = kv_bytes_per_block(ARGS, BLOCK_SIZE, torch.float32)


def random_cache(device: str, num_blocks: int = 16, seed: int = 0) -> KVCache:
    kv = KVCache(ARGS, num_blocks, BLOCK_SIZE, torch.float32, torch.device(device))
    gen = torch.Generator().manual_seed(seed)
    for k, v in kv.layers:
        k.copy_(torch.randn(k.shape, generator=gen))
        v.copy_(torch.randn(v.shape, generator=gen))
    return kv


def block_bytes(kv: KVCache, block: int) -> torch.Tensor:
    """A block's K and V of every layer, on the CPU."""
    return torch.stack([torch.stack((k[block], v[block])) for k, v in kv.layers]).cpu()


def scramble(kv: KVCache, blocks: list[int]) -> None:
    for k, v in kv.layers:
        k[blocks] = -1.0
        v[blocks] = -2.0


def disk_store(root, device: str, read_threads: int | None = None) -> DiskStore:
    """A disk tier in root for random_cache's layout (bounded at 1 GiB)."""
    layout = Layout("digest", "float32", BLOCK_SIZE, ARGS.num_hidden_layers, ARGS.num_key_value_heads,
                    ARGS.head_dim, device)
    return DiskStore(root, layout, SIZE, 1 << 30, read_threads)


@functools.cache
def disk_block(b: int) -> BlockIdentity:
    """Block b of one chain of BLOCK_SIZE-token blocks (tokens 0, 1, 2... in turn), hashed as the
    block manager hashes them."""
    parent = disk_block(b - 1).hash if b else None
    tokens = tuple(range(b * BLOCK_SIZE, (b + 1) * BLOCK_SIZE))
    return BlockIdentity(block_hash(parent, tokens), parent, tokens)


def disk_hash(b: int) -> bytes:
    return disk_block(b).hash


def write_blocks(kv: KVCache, root, device: str, n: int) -> dict[int, torch.Tensor]:
    """Blocks 0..n-1 of kv saved as disk_block(0..n-1) to the disk tier in root by a server that
    then stops; their bytes."""
    writer = KVTiers(kv, host_blocks=0, disk=disk_store(root, device))
    for b in range(n):
        block = disk_block(b)
        writer.committed(block.hash, b, block.parent, block.tokens)
    writer.close()
    return {b: block_bytes(kv, b) for b in range(n)}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
