"""The engine on a tiny random model: batching, preemption, swap, prefix cache, abort, n > 1."""
from __future__ import annotations

import random

import pytest

from model_fixtures import cached_llm, fixture_model
from mlxr import LLM, SamplingParams
from mlxr.errors import ContextLengthError, OverloadedError

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir():
    return str(fixture_model("tiny-llama").hf_dir)


def random_requests(n: int, seed: int = 0, vocab: int = 500):
    rng = random.Random(seed)
    return [
        ([rng.randrange(3, vocab) for _ in range(rng.randint(1, 40))], rng.randint(1, 24))
        for _ in range(n)
    ]


def alone(llm: LLM, reqs) -> list[list[int]]:
    return [
        llm.generate([ids], SamplingParams(max_tokens=n, **GREEDY))[0].outputs[0].token_ids
        for ids, n in reqs
    ]


def staggered(llm: LLM, reqs, per_step: int = 3) -> tuple[list[list[int]], list]:
    """Add requests a few at a time while others run; returns tokens and the stats over time."""
    engine, finals, pending, stats = llm.engine, {}, list(enumerate(reqs)), []
    while pending or engine.has_unfinished():
        for i, (ids, n) in pending[:per_step]:
            engine.add_request(f"s{i}", ids, SamplingParams(max_tokens=n, **GREEDY))
        pending = pending[per_step:]
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out.outputs[0].token_ids
        stats.append(engine.stats())
    return [finals[f"s{i}"] for i in range(len(reqs))], stats


@pytest.fixture(scope="module")
def reference(model_dir):
    reqs = random_requests(64)
    return reqs, alone(cached_llm(model_dir), reqs)


def test_64_staggered_requests_match_each_alone(model_dir, reference):
    reqs, expected = reference
    llm = LLM(model_dir, dtype="float32", max_num_batched_tokens=64, max_num_seqs=16)
    got, stats = staggered(llm, reqs)
    assert got == expected
    assert max(s.num_requests_running for s in stats) > 1  # really batched
    assert llm.engine.stats().kv_blocks_used == 0


@pytest.mark.parametrize("swap", [0.0, 0.001])
def test_tiny_cache_preempts_and_loses_nothing(model_dir, reference, swap):
    reqs, expected = reference
    llm = LLM(model_dir, dtype="float32", num_kv_blocks=12, block_size=4,
              max_num_batched_tokens=64, max_num_seqs=16, swap_space_gb=swap,
              enable_prefix_caching=False)
    got, stats = staggered(llm, reqs[:24], per_step=8)
    final = llm.engine.stats()
    assert got == expected[:24]
    assert final.num_preemptions > 0
    if swap:
        assert max(s.num_requests_swapped for s in stats) > 0
    assert final.kv_blocks_used == 0 and final.finished_by_reason == {"length": 24}


def test_shared_prefix_hits_cache_and_output_is_unchanged(model_dir):
    prefix = list(range(10, 74))  # 4 full blocks of 16
    a, b = prefix + [5, 6, 7], prefix + [8, 9]
    fresh = LLM(model_dir, dtype="float32", enable_prefix_caching=False)
    want = [o.outputs[0].token_ids for o in fresh.generate([a, b], SamplingParams(max_tokens=8, **GREEDY))]
    llm = LLM(model_dir, dtype="float32")
    first = llm.generate([a], SamplingParams(max_tokens=8, **GREEDY))[0]
    second = llm.generate([b], SamplingParams(max_tokens=8, **GREEDY))[0]
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 64
    assert [first.outputs[0].token_ids, second.outputs[0].token_ids] == want
    assert llm.engine.stats().prefix_cache_hit_tokens == 64


def test_abort_in_every_state_frees_every_block(model_dir):
    llm = LLM(model_dir, dtype="float32", max_num_batched_tokens=16, max_num_seqs=2)
    engine = llm.engine
    before = engine.stats().kv_blocks_used
    params = SamplingParams(max_tokens=50, **GREEDY)
    for i in range(4):
        engine.add_request(f"r{i}", list(range(3, 43)), params)  # 40-token prompts: chunked
    engine.step()  # r0 prefilling, r1.. waiting
    assert engine.abort("r3").finished  # queued
    assert engine.abort("r0").outputs[0].finish_reason == "abort"  # mid-prefill
    for _ in range(6):
        engine.step()
    assert engine.abort("r1") is not None  # decoding
    engine.step()
    engine.abort("r2")
    stats = engine.stats()
    assert not engine.has_unfinished() and stats.kv_blocks_used == before
    assert stats.num_aborted == 4 and stats.num_requests_running == stats.num_requests_waiting == 0


def test_n4_seeded_samples_share_prompt_blocks_and_reproduce(model_dir):
    llm = LLM(model_dir, dtype="float32", block_size=4)
    params = SamplingParams(n=4, max_tokens=12, temperature=1.0, seed=1234)
    prompt = list(range(20, 50))  # 30 tokens: 7 full blocks + a partial one
    engine = llm.engine
    engine.add_request("n4", prompt, params)
    shared = None
    scheduler = engine.core.core.scheduler
    while engine.has_unfinished():
        engine.step()
        samples = [r for rid, r in scheduler.requests.items() if rid.startswith("n4#")]
        if shared is None and len(samples) == 4 and all(s.block_table for s in samples):
            tables = [s.block_table for s in samples]
            shared = all(t[:7] == tables[0][:7] for t in tables)
    assert shared, "the later samples must find the prompt's full blocks in the prefix cache"
    first = llm.generate([prompt], params)[0]
    again = llm.generate([prompt], params)[0]
    samples = [o.token_ids for o in first.outputs]
    assert samples == [o.token_ids for o in again.outputs]
    assert len({tuple(s) for s in samples}) > 1  # four different samples
    assert [o.index for o in first.outputs] == [0, 1, 2, 3]


def test_admission_refuses_what_can_never_fit(model_dir):
    llm = LLM(model_dir, dtype="float32", num_kv_blocks=4, block_size=4, max_waiting=2)
    with pytest.raises(ContextLengthError) as e:  # the 16-token cache caps the context
        llm.generate([list(range(3, 40))], SamplingParams(max_tokens=4))
    assert "37" in str(e.value) and "16" in str(e.value)
    with pytest.raises(ContextLengthError) as e:
        llm.generate([list(range(3, 13))], SamplingParams(max_tokens=7))
    assert e.value.param == "max_tokens" and "17" in str(e.value)
    assert llm.generate([list(range(3, 13))], SamplingParams(max_tokens=6))[0].outputs[0].token_ids
    llm2 = LLM(model_dir, dtype="float32", max_waiting=2, max_num_seqs=1)
    p = SamplingParams(max_tokens=2)
    llm2.engine.add_request("a", [5, 6], p)
    llm2.engine.add_request("b", [5, 6], p)
    with pytest.raises(OverloadedError):
        llm2.engine.add_request("c", [5, 6], p)


def test_aborting_an_n3_request_before_it_forks_finishes_it(model_dir):
    llm = LLM(model_dir, dtype="float32", max_num_batched_tokens=8)
    llm.engine.add_request("n3", list(range(5, 45)), SamplingParams(n=3, max_tokens=5, temperature=1.0))
    llm.engine.step()  # mid-prefill: only the parent sequence exists
    out = llm.engine.abort("n3")
    assert out.finished and llm.engine.stats().kv_blocks_used == 0


def test_text_past_the_vocabulary_and_huge_seeds_are_handled(model_dir):
    llm = LLM(model_dir, dtype="float32")
    out = llm.generate([[5, 6]], SamplingParams(n=2, max_tokens=2, seed=2**64 - 1))[0]
    assert len(out.outputs) == 2
    with pytest.raises(Exception) as e:
        SamplingParams(stop=["x"] * 65)
    assert "stop" in str(e.value)
