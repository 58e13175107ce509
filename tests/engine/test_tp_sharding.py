"""Tensor parallelism's cuts, one layer at a time and in one process: each rank's share of a
dense, FP8 or GGUF linear, put back together as the group would (outputs side by side for a
column-parallel layer, partial sums added for a row-parallel one), gives the whole layer's
result; shapes that do not split are refused with a message naming the shape."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from mlxr.distributed.sharding import check_supported, head_share, shard_args
from mlxr.distributed.slicing import ShardingError, take_columns, take_rows
from mlxr.layers.fp8_linear import FP8Linear
from mlxr.layers.linear import Linear
from mlxr.layers.quant_linear import PackedWeight, QuantLinear
from mlxr.model_config import ModelArgs
from mlxr.quantize.encode import encode

N, K = 64, 1024


def quant_linear(qtype: Q, seed: int = 0) -> QuantLinear:
    w = np.random.default_rng(seed).standard_normal((N, K)).astype(np.float32) * 0.1
    raw = torch.from_numpy(encode(w, qtype).reshape(N, -1).copy())
    return QuantLinear(PackedWeight(raw, qtype.name, (N, K)), torch.randn(N))


def dense_linear() -> Linear:
    m = Linear(K, N, bias=True)
    torch.nn.init.normal_(m.weight, std=0.1)
    return m


LAYERS = {"fp32": dense_linear, "q8_0": lambda: quant_linear(Q.Q8_0), "q4_k": lambda: quant_linear(Q.Q4_K),
          "fp8": lambda: FP8Linear(dense_linear().weight.detach(), torch.randn(N))}


@pytest.mark.parametrize("kind", list(LAYERS))
@pytest.mark.parametrize("world", [2, 4])
def test_column_parallel_shares_side_by_side_are_the_whole_layer(kind, world):
    layer, x = LAYERS[kind](), torch.randn(5, K)
    with torch.inference_mode():
        whole = layer(x)
        per = N // world
        parts = []
        for r in range(world):
            share = copy.deepcopy(layer)
            take_rows(share, [(r * per, (r + 1) * per)], {})
            parts.append(share(x))
    torch.testing.assert_close(torch.cat(parts, dim=-1), whole, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", list(LAYERS))
@pytest.mark.parametrize("world", [2, 4])
def test_row_parallel_partial_sums_add_up_to_the_whole_layer(kind, world):
    layer, x = LAYERS[kind](), torch.randn(5, K)
    with torch.inference_mode():
        whole = layer(x)
        per = K // world
        total = torch.zeros_like(whole, dtype=torch.float64)
        for r in range(world):
            share = copy.deepcopy(layer)
            bias = take_columns(share, r * per, (r + 1) * per, "layer")
            total += share(x[:, r * per:(r + 1) * per]).double()
        total += bias.double()
    if kind == "fp8":  # each share's activations take that share's own scale: as close as the whole
        exact = x @ (layer.weight_fp8.float() * layer.weight_scale.reshape(-1, 1)).t() + layer.bias
        assert (total.float() - exact).norm() <= 1.5 * (whole - exact).norm()
    else:
        torch.testing.assert_close(total.float(), whole, rtol=0, atol=1e-5)


def test_a_q4_k_share_off_its_256_block_boundaries_is_refused():
    layer = quant_linear(Q.Q4_K)
    with pytest.raises(ShardingError, match=r"Q4_K blocks hold 256 inputs.*\[128, 256\)"):
        take_columns(layer, 128, 256, "model.layers.0.mlp.down_proj")


ARGS = ModelArgs("llama", 512, 64, 128, 2, num_attention_heads=8, num_key_value_heads=2, head_dim=8)


def test_kv_heads_split_when_there_are_enough_and_are_shared_when_fewer():
    assert [dataclasses.astuple(head_share(ARGS, r, 2)) for r in range(2)] == [(0, 4, 0, 1), (4, 4, 1, 1)]
    # 4 ranks, 2 KV heads: ranks 0 and 1 read KV head 0, ranks 2 and 3 KV head 1
    assert [(s.q0, s.kv0, s.kv_heads) for s in (head_share(ARGS, r, 4) for r in range(4))] == [
        (0, 0, 1), (2, 0, 1), (4, 1, 1), (6, 1, 1)]
    assert shard_args(ARGS, 3, 8).num_key_value_heads == 1


def test_shapes_that_do_not_split_are_refused_by_name():
    with pytest.raises(ShardingError, match="8 attention heads do not split over 3 ranks"):
        check_supported(ARGS, 3)
    with pytest.raises(ShardingError, match="mixture-of-experts"):
        check_supported(dataclasses.replace(ARGS, num_experts=4, num_experts_per_tok=2), 2)
