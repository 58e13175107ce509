"""Data parallelism on the CPU (two core processes of a tiny Llama): the same greedy outputs as
one core; a shared-prefix workload placed on the replica holding each prefix (prefix-cache hits
at least 90% of one replica's); and a replica killed with SIGKILL fails only the requests it
held, while the other replica's finish unchanged, and comes back."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import time

import psutil
import pytest
import torch

from model_fixtures import fixture_model
from mlxr import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
pytestmark = pytest.mark.slow  # each engine starts two core processes (torch imports, warm-ups)


@pytest.fixture(scope="module")
def model() -> str:
    return str(fixture_model("tiny-llama").hf_dir)


@pytest.fixture(scope="module")
def dp2(model):
    llm = LLM(model, dtype=torch.float32, data_parallel_size=2)
    yield llm
    llm.shutdown()


def prompts(n: int) -> list[list[int]]:
    return [[(7 * k + 3 * i) % 500 + 5 for i in range(20 + 5 * k)] for k in range(n)]


def texts(llm: LLM, batch: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(batch, params)]


def shared_prefix_batches() -> list[list[list[int]]]:
    """4 system prompts of 64 tokens (4 blocks), 8 questions each: a first wave of one question
    per system prompt, then the other 28 at once."""
    systems = [[(11 * s + 5 * i) % 480 + 10 for i in range(64)] for s in range(4)]
    ask = lambda s, q: systems[s] + [(s * 8 + q + 3 * i) % 500 + 5 for i in range(9)]  # noqa: E731
    return [[ask(s, 0) for s in range(4)], [ask(s, q) for s in range(4) for q in range(1, 8)]]


def test_greedy_outputs_match_one_core(model, dp2):
    batch = prompts(12)
    one = LLM(model, dtype=torch.float32)
    try:
        expected = texts(one, batch)
    finally:
        one.shutdown()
    assert texts(dp2, batch) == expected
    pins = [os.sched_getaffinity(pid) for pid in dp2.engine.core.pids()]
    if len(os.sched_getaffinity(0)) >= 2:  # each core on its own share of the CPUs
        assert pins[0] and pins[1] and pins[0].isdisjoint(pins[1]), pins
    per = dp2.engine.stats().data_parallel
    assert all(per[r]["placed_load"] + per[r]["placed_prefix"] > 0 for r in ("0", "1")), per  # both served


def test_shared_prefixes_land_on_their_replica(model, dp2):
    one = LLM(model, dtype=torch.float32)
    try:
        for batch in shared_prefix_batches():
            texts(one, batch)
        single = one.engine.stats().prefix_cache_hit_tokens
    finally:
        one.shutdown()
    before = dp2.engine.stats()
    for batch in shared_prefix_batches():
        texts(dp2, batch)
        time.sleep(0.3)  # the replicas' events reach the router
    after = dp2.engine.stats()
    hits = after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens
    assert single > 0 and hits >= 0.9 * single, (hits, single)
    placed = {r: after.data_parallel[r]["placed_prefix"] - before.data_parallel[r]["placed_prefix"] for r in ("0", "1")}
    assert sum(placed.values()) >= 28, placed  # every question after the first wave went by affinity


def test_a_killed_core_fails_only_its_requests(model, dp2):
    long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    batch = prompts(6)
    expected = texts(dp2, batch, long)  # both replicas healthy
    engine, client = dp2.engine, dp2.engine.core
    ids = [f"kill-{i}" for i in range(len(batch))]
    for rid, prompt in zip(ids, batch):
        engine.add_request(rid, prompt, long)
    owner = {rid: client._owner[rid] for rid in ids}
    assert set(owner.values()) == {0, 1}
    victim = client.pids()[0]
    finals = {}
    while engine.has_unfinished():
        outputs = engine.step()
        finals.update({out.request_id: out for out in outputs if out.finished})
        if victim is not None and outputs and not finals:  # mid-generation on both replicas
            os.kill(victim, signal.SIGKILL)
            victim = None
    assert victim is None, "the requests finished before the kill"
    for i, rid in enumerate(ids):
        out = finals[rid]
        if owner[rid] == 0:
            assert out.outputs[0].finish_reason == "error" and out.error, rid
        else:
            assert out.outputs[0].finish_reason == "length" and out.outputs[0].token_ids == expected[i], rid
    deadline = time.monotonic() + 120
    while engine.stats().data_parallel["0"]["up"] == 0:
        assert time.monotonic() < deadline, "replica 0 did not come back"
        engine.step()
        time.sleep(0.1)
    assert engine.stats().data_parallel["0"]["restarts"] == 1
    assert texts(dp2, batch) == [e[:8] for e in expected]  # both replicas serve again


def test_replicas_publish_at_offset_ports_with_their_rank(model):
    """With --kv-events-endpoint, replica r publishes at the port plus r (vLLM's rule) and its
    batches carry data_parallel_rank r; the router reads the same streams."""
    import msgspec
    import zmq

    from server_harness import free_port

    port = free_port()
    while True:  # two free ports in a row
        with contextlib.suppress(OSError), socket.socket() as s:
            s.bind(("127.0.0.1", port + 1))
            break
        port = free_port()
    subs = []
    for r in range(2):
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{port + r}")
        subs.append(sub)
    llm = LLM(model, dtype=torch.float32, data_parallel_size=2, kv_events_endpoint=f"tcp://127.0.0.1:{port}")
    try:
        texts(llm, prompts(8))
        for r, sub in enumerate(subs):
            ranks = set()
            while sub.poll(1500):
                _, _, payload = sub.recv_multipart()
                ranks.add(msgspec.msgpack.decode(payload)[2])
            assert ranks == {r}
        per = llm.engine.stats().data_parallel
        assert all(per[r]["blocks_indexed"] > 0 for r in ("0", "1")), per
    finally:
        llm.shutdown()
        for sub in subs:
            sub.close(linger=0)


def test_tensor_parallel_replicas_match_one_core(model):
    """DP=2 x TP=2 over gloo: each replica's core is rank 0 of its own group, its rank-1 worker
    on the replica's share of the CPUs; the greedy outputs are one core's."""
    batch = prompts(6)
    one = LLM(model, dtype=torch.float32)
    try:
        expected = texts(one, batch)
    finally:
        one.shutdown()
    llm = LLM(model, dtype=torch.float32, data_parallel_size=2, tensor_parallel_size=2)
    try:
        got = texts(llm, batch)
        groups = [[pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))] for pid in llm.engine.core.pids()]
        pins = [set().union(*(os.sched_getaffinity(pid) for pid in g)) for g in groups]
    finally:
        llm.shutdown()
    assert got == expected
    assert [len(g) for g in groups] == [2, 2], groups  # a core and its worker each
    if len(os.sched_getaffinity(0)) >= 2:
        assert pins[0].isdisjoint(pins[1]), pins


@pytest.mark.gpu
def test_tensor_parallel_replicas_on_their_own_gpus_match_one_gpu(model):
    """DP=2 x TP=2 on 4 GPUs (NCCL): each replica's ranks on devices of their own."""
    if torch.cuda.device_count() < 4:
        pytest.skip("needs 4 CUDA devices")
    batch = prompts(6)
    one = LLM(model, dtype=torch.float32, device="cuda")
    try:
        expected = texts(one, batch)
    finally:
        one.shutdown()
    llm = LLM(model, dtype=torch.float32, device="cuda", data_parallel_size=2, tensor_parallel_size=2)
    try:
        got = texts(llm, batch)
        visible = [psutil.Process(pid).environ().get("CUDA_VISIBLE_DEVICES") for pid in llm.engine.core.pids()]
    finally:
        llm.shutdown()
    assert got == expected
    names = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(torch.cuda.device_count())))
    names = names.split(",")
    assert visible == [",".join(names[0:2]), ",".join(names[2:4])], visible
