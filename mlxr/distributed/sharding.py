"""Split a built model over the ranks of a tensor-parallel group from outside, as gpt-fast's
tp.py does: the model files stay math. Per decoder layer: q/k/v and gate/up by output
(column-parallel; fused matrices part by part), o_proj and down_proj by input (row-parallel,
one all-reduce each: one per layer half), attention heads split with each rank's KV heads
(replicated when there are fewer KV heads than ranks); the embedding and the lm_head by
vocabulary rows."""
from __future__ import annotations

import dataclasses

from torch import nn

from mlxr.distributed.parallel_state import TPGroup
from mlxr.distributed.sharded_layers import RowParallel, VocabParallelEmbedding, VocabParallelLMHead
from mlxr.distributed.slicing import ShardingError, take_columns, take_embedding_rows, take_rows
from mlxr.layers.mlp import GatedMLP
from mlxr.model_config import ModelArgs


@dataclasses.dataclass(frozen=True)
class HeadShare:
    """One rank's attention heads: query heads [q0, q0 + heads), KV heads [kv0, kv0 + kv_heads)."""

    q0: int
    heads: int
    kv0: int
    kv_heads: int


def head_share(args: ModelArgs, rank: int, world: int) -> HeadShare:
    h, kv = args.num_attention_heads, args.num_key_value_heads
    if h % world:
        raise ShardingError(f"{h} attention heads do not split over {world} ranks")
    if kv % world and world % kv:
        raise ShardingError(f"{kv} KV heads neither split over {world} ranks nor divide them")
    heads = h // world
    if kv >= world:
        return HeadShare(rank * heads, heads, rank * (kv // world), kv // world)
    return HeadShare(rank * heads, heads, rank * kv // world, 1)  # ranks share a KV head


def shard_args(args: ModelArgs, rank: int, world: int) -> ModelArgs:
    """The per-rank shape the KV cache is sized by."""
    share = head_share(args, rank, world)
    return dataclasses.replace(args, num_attention_heads=share.heads, num_key_value_heads=share.kv_heads)


def check_supported(args: ModelArgs, world: int) -> None:
    if args.num_experts:
        raise ShardingError(f"tensor parallelism does not split mixture-of-experts layers yet "
                            f"({args.model_type}, {args.num_experts} experts); run it on one device")
    head_share(args, 0, world)
    if args.intermediate_size % world:
        raise ShardingError(f"intermediate size {args.intermediate_size} does not split over {world} ranks")


def shard_model(model: nn.Module, args: ModelArgs, group: TPGroup) -> ModelArgs:
    """Cut `model` (built whole) down to this rank's share in place; returns the rank's args."""
    rank, world = group.rank, group.world
    check_supported(args, world)
    memo: dict = {}
    share = head_share(args, rank, world)
    seen: set[int] = set()
    for name, m in list(model.named_modules()):
        if hasattr(m, "o_proj") and hasattr(m, "attn"):
            _shard_attention(m, name, args, share, group, memo, seen)
        elif isinstance(m, GatedMLP):
            _shard_mlp(m, name, args.intermediate_size, group, memo, seen)
    _shard_vocab(model, args.vocab_size, group, memo, seen)
    _check_nothing_left(model, seen)
    return shard_args(args, rank, world)


def _shard_attention(m: nn.Module, name: str, args: ModelArgs, s: HeadShare, group: TPGroup,
                     memo: dict, seen: set[int]) -> None:
    d, h, kv = args.head_dim, args.num_attention_heads, args.num_key_value_heads
    if getattr(getattr(m, "q_norm", None), "weight", None) is not None and m.q_norm.weight.numel() != d:
        raise ShardingError(f"{name}: a q/k norm over all heads at once does not split by heads")
    q = (s.q0 * d, (s.q0 + s.heads) * d)
    k = (s.kv0 * d, (s.kv0 + s.kv_heads) * d)
    if getattr(m, "qkv_proj", None) is not None:
        take_rows(m.qkv_proj, [q, (h * d + k[0], h * d + k[1]), ((h + kv) * d + k[0], (h + kv) * d + k[1])], memo)
        seen.add(id(m.qkv_proj))
    else:
        for proj, rows in ((m.q_proj, q), (m.k_proj, k), (m.v_proj, k)):
            take_rows(proj, [rows], memo)
            seen.add(id(proj))
    bias = take_columns(m.o_proj, q[0], q[1], f"{name}.o_proj")
    seen.add(id(m.o_proj))
    m.o_proj = RowParallel(m.o_proj, bias, group)
    m.n_heads, m.n_kv = s.heads, s.kv_heads
    m.attn.num_heads, m.attn.num_kv_heads = s.heads, s.kv_heads


def _shard_mlp(m: GatedMLP, name: str, inter: int, group: TPGroup, memo: dict, seen: set[int]) -> None:
    per = inter // group.world
    lo, hi = group.rank * per, (group.rank + 1) * per
    if m.gate_up_proj is not None:
        take_rows(m.gate_up_proj, [(lo, hi), (inter + lo, inter + hi)], memo)
        seen.add(id(m.gate_up_proj))
    else:
        for proj in (m.gate_proj, m.up_proj):
            take_rows(proj, [(lo, hi)], memo)
            seen.add(id(proj))
    bias = take_columns(m.down_proj, lo, hi, f"{name}.down_proj")
    seen.add(id(m.down_proj))
    m.down_proj = RowParallel(m.down_proj, bias, group)


def _shard_vocab(model: nn.Module, vocab: int, group: TPGroup, memo: dict, seen: set[int]) -> None:
    per = -(-vocab // group.world)  # the last rank's share is padded with zero rows
    lo, hi = min(vocab, group.rank * per), min(vocab, (group.rank + 1) * per)
    backbone = model.model
    take_embedding_rows(backbone.embed_tokens, lo, hi, memo)
    seen.add(id(backbone.embed_tokens))
    backbone.embed_tokens = VocabParallelEmbedding(backbone.embed_tokens, lo, hi, group)
    take_rows(model.lm_head, [(lo, hi)], memo, pad_to=per)
    seen.add(id(model.lm_head))
    model.lm_head = VocabParallelLMHead(model.lm_head, vocab, group)


def _check_nothing_left(model: nn.Module, seen: set[int]) -> None:
    """A weight-bearing layer the rules above did not reach would run whole on every rank and
    silently compute something else: refuse instead (the router of an MoE, a model's own extra)."""
    for name, m in model.named_modules():
        holds_matrix = any(p.dim() >= 2 for p in m.parameters(recurse=False)) or hasattr(m, "raw")
        if holds_matrix and id(m) not in seen:
            raise ShardingError(f"tensor parallelism has no rule for {name} ({type(m).__name__})")
