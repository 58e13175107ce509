"""Recurrent-state checkpoints (kv/state_checkpoints.py) and their torch-free index
(sched/state_index.py): groundwork for prefix caching of hybrid models (docs/kv-cache.md)."""
from __future__ import annotations

import torch

from mlxr.engine.kv.state import RecurrentState
from mlxr.engine.kv.state_checkpoints import StateCheckpoints, num_checkpoints_for_memory
from mlxr.engine.sched.state_index import StateCheckpointIndex
from mlxr.model_config import LinearAttentionArgs

ARGS = LinearAttentionArgs(layers=(True, True, False, True), num_key_heads=2, num_value_heads=4,
                           key_head_dim=8, value_head_dim=8, conv_kernel=4)


def _filled_state(num_slots: int) -> RecurrentState:
    state = RecurrentState(ARGS, num_slots, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    for conv, delta in state.pools.values():
        conv.copy_(torch.randn(conv.shape, generator=gen))
        delta.copy_(torch.randn(delta.shape, generator=gen))
    return state


def test_save_then_restore_moves_every_layers_state_between_slots():
    state = _filled_state(3)
    before = {layer: (c[1].clone(), d[1].clone()) for layer, (c, d) in state.pools.items()}
    checkpoints = StateCheckpoints(state, 2)
    checkpoints.save([(1, 0)])
    for conv, delta in state.pools.values():  # the slot is reused by another request
        conv[1].zero_()
        delta[1].zero_()
    checkpoints.restore([(0, 2)])
    assert set(checkpoints.pools) == {0, 1, 3}
    for layer, (conv, delta) in state.pools.items():
        assert torch.equal(conv[2], before[layer][0]) and torch.equal(delta[2], before[layer][1])
        assert not conv[1].any() and not delta[1].any()


def test_pool_size_follows_the_memory_budget_and_stays_bounded():
    per = ARGS.state_bytes_per_sequence()
    assert num_checkpoints_for_memory(ARGS, 10 * per / (1 << 30)) == 10
    assert num_checkpoints_for_memory(ARGS, 0.0) == 0
    assert num_checkpoints_for_memory(ARGS, 1e6, max_checkpoints=64) == 64
    state = RecurrentState(ARGS, 1, torch.device("cpu"))
    assert StateCheckpoints(state, 10).nbytes == 10 * per


def test_index_evicts_least_recently_used_and_spares_pinned():
    index = StateCheckpointIndex(2)
    a, b = index.reserve(b"a"), index.reserve(b"b")
    assert {a, b} == {0, 1}
    assert index.lookup(b"a") == a  # b is now the least recently used
    c = index.reserve(b"c")
    assert c == b and b"b" not in index and b"a" in index
    assert index.reserve(b"d", pinned=frozenset({a, c})) is None  # nothing may go
    index.drop(b"a")
    assert index.reserve(b"d") == a and len(index) == 2


def test_deepest_checkpointed_block_of_a_chain():
    index = StateCheckpointIndex(4)
    index.reserve(b"h1")
    index.reserve(b"h3")
    assert index.deepest([b"h0", b"h1", b"h2", b"h3", b"h4"]) == 4
    assert index.deepest([b"h0", b"h1", b"h2"]) == 2
    assert index.deepest([b"h0"]) == 0


def test_a_held_checkpoint_is_never_evicted_until_let_go():
    index = StateCheckpointIndex(2)
    held = index.hold(b"swap:r1")
    first = index.reserve(b"a")
    assert index.reserve(b"b") == first and b"a" not in index  # only the unheld one turns over
    assert index.hold(b"swap:r2") == first and b"b" not in index  # a hold may evict a cached one
    assert index.hold(b"swap:r3") is None and index.reserve(b"d") is None  # both held: nothing to take
    assert index.held(b"swap:r1") == held
    index.let_go(b"swap:r1")
    assert index.held(b"swap:r1") is None and index.reserve(b"c") == held
