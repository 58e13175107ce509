"""Overlapped steps (step N+1 launched before step N's tokens reach the host), forced on the
CPU: every output must equal the synchronous engine's, and no KV block may leak."""
from __future__ import annotations

import pytest

from model_fixtures import fixture_model
from mlxr import LLM, SamplingParams
from test_engine_e2e import GREEDY, random_requests, staggered


@pytest.fixture(scope="module")
def model_dir():
    return str(fixture_model("tiny-llama").hf_dir)


def engines(model_dir, **kwargs) -> tuple[LLM, LLM]:
    sync = LLM(model_dir, dtype="float32", overlap_steps=False, **kwargs)
    overlapped = LLM(model_dir, dtype="float32", overlap_steps=True, **kwargs)
    return sync, overlapped


def texts(llm: LLM, prompts, params) -> list[tuple]:
    outs = llm.generate(prompts, params)
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]


def run_to_end(engine) -> dict:
    """Step the engine until nothing is left: each request's final output by id."""
    finals = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                finals[o.request_id] = o
    return finals


def trace(llm: LLM) -> list[str]:
    """Record, in order, each step's launch ("execute") and each wait for its tokens ("result")."""
    events = []
    runner = llm.engine.core.core.runner
    real_execute, real_launch = runner.execute, runner.sampler.launch

    def execute(out, *rest):
        events.append("execute")
        return real_execute(out, *rest)

    def launch(logits, states, pending=None, *rest):
        future = real_launch(logits, states, pending, *rest)
        real_result = future.result
        future.result = lambda: (events.append("result"), real_result())[1]
        return future

    runner.execute, runner.sampler.launch = execute, launch
    return events


def test_launches_the_next_step_before_taking_in_the_last(model_dir):
    _, llm = engines(model_dir)
    events = trace(llm)
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, **GREEDY))
    assert events[:5] == ["execute", "execute", "result", "execute", "result"]


def test_staggered_batches_match_the_synchronous_engine(model_dir):
    reqs = random_requests(24, seed=3)
    sync, overlapped = engines(model_dir, max_num_batched_tokens=48, max_num_seqs=8)
    want, _ = staggered(sync, reqs)
    got, stats = staggered(overlapped, reqs)
    assert got == want
    assert max(s.num_requests_running for s in stats) > 1
    assert overlapped.engine.stats().kv_blocks_used == 0


# With prefix caching, a request swapped out while its prompt chunk is in flight once crashed
# that step's landing (its full blocks hashed from a block table it no longer held).
@pytest.mark.parametrize("swap,prefix", [(0.0, False), (0.001, False), (0.001, True)])
def test_preemption_under_a_tiny_cache_matches(model_dir, swap, prefix):
    reqs = random_requests(64)[:16]
    kw = dict(num_kv_blocks=12, block_size=4, max_num_batched_tokens=64, max_num_seqs=16,
              swap_space_gb=swap, enable_prefix_caching=prefix)
    sync, overlapped = engines(model_dir, **kw)
    want, _ = staggered(sync, reqs, per_step=8)
    got, _ = staggered(overlapped, reqs, per_step=8)
    final = overlapped.engine.stats()
    assert got == want and final.num_preemptions > 0 and final.kv_blocks_used == 0


def test_stops_found_a_step_late_give_the_same_text(model_dir):
    sync, overlapped = engines(model_dir)
    base = sync.generate([[9, 10, 11]], SamplingParams(max_tokens=12, **GREEDY))[0].outputs[0]
    stop_token = base.token_ids[5]
    stop_text = base.text[3:6] if len(base.text) > 6 else None
    cases = [SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop_token]),
             SamplingParams(max_tokens=12, temperature=0.7, seed=11),
             SamplingParams(max_tokens=7, temperature=0.0, logprobs=2)]
    if stop_text:
        cases.append(SamplingParams(max_tokens=12, temperature=0.0, stop=[stop_text]))
    for params in cases:
        assert texts(overlapped, [[9, 10, 11], [4, 5]], params) == texts(sync, [[9, 10, 11], [4, 5]], params)
    assert overlapped.engine.stats().kv_blocks_used == 0


def test_chunked_prompts_with_steps_that_sample_nothing(model_dir):
    """A long prompt alone takes several chunks, none of which samples until the last."""
    sync, overlapped = engines(model_dir, max_num_batched_tokens=16)
    prompts = [list(range(5, 45)), list(range(7, 60))]
    params = SamplingParams(max_tokens=5, **GREEDY)
    for prompt in prompts:
        assert texts(overlapped, [prompt], params) == texts(sync, [prompt], params)
    assert texts(overlapped, prompts, params) == texts(sync, prompts, params)


def test_penalties_and_min_tokens_count_the_token_still_on_the_device(model_dir):
    """Penalties and min_tokens read the tokens so far, the last one from the device: the
    results equal the synchronous engine's, and the steps still overlap."""
    sync, overlapped = engines(model_dir)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14, 15]]
    eos = sync.tokenizer.stop_token_ids
    params = [SamplingParams(max_tokens=16, temperature=0.0, repetition_penalty=1.3),
              SamplingParams(max_tokens=16, temperature=0.0, min_tokens=6, ignore_eos=False,
                             logit_bias={t: 30.0 for t in eos}),  # EOS wins as soon as it may
              SamplingParams(max_tokens=16, temperature=0.9, seed=3, presence_penalty=0.5, frequency_penalty=0.7),
              SamplingParams(max_tokens=16, temperature=0.0, repetition_penalty=0.7, frequency_penalty=-0.4)]
    want = texts(sync, prompts, params)
    assert texts(overlapped, prompts, params) == want
    assert len(want[1][0]) == 7 and want[1][2] == "stop"  # 6 forced tokens, then EOS
    events = trace(overlapped)
    overlapped.generate([prompts[0]], params[0])
    assert events[:5] == ["execute", "execute", "result", "execute", "result"]  # overlapped


def test_n_greater_than_one_makes_the_engine_wait(model_dir):
    sync, overlapped = engines(model_dir)
    params = SamplingParams(n=3, max_tokens=8, temperature=1.0, seed=9)
    got = overlapped.generate([[5, 6, 7]], params)[0]
    want = sync.generate([[5, 6, 7]], params)[0]
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in want.outputs]


def test_abort_while_a_step_is_in_flight_frees_everything(model_dir):
    _, llm = engines(model_dir, max_num_seqs=4)
    engine = llm.engine
    params = SamplingParams(max_tokens=30, **GREEDY)
    for i in range(3):
        engine.add_request(f"r{i}", [5 + i, 6, 7], params)
    for _ in range(4):
        engine.step()
    assert engine.core.core.in_flight.launched is not None
    out = engine.abort("r1")
    assert out.finished and all(t >= 0 for t in out.outputs[0].token_ids)
    while engine.has_unfinished():
        engine.step()
    assert engine.stats().kv_blocks_used == 0
    llm.generate([[3, 4]], SamplingParams(max_tokens=3, **GREEDY))  # the engine goes on
    assert engine.stats().kv_blocks_used == 0


@pytest.mark.parametrize("overlap", [False, True])
def test_later_samples_start_from_the_computed_prompt(model_dir, overlap):
    """n > 1: the samples after the first start once it has computed the prompt, find its
    full blocks in the prefix cache and compute only the partial block's tokens."""
    llm = LLM(model_dir, dtype="float32", block_size=16, overlap_steps=overlap)
    engine, prompt = llm.engine, list(range(5, 45))  # 40 tokens: 2 full blocks and a partial
    engine.add_request("n2", prompt, SamplingParams(n=2, max_tokens=6, temperature=1.0, seed=4))
    scheduler = engine.core.core.scheduler
    while "n2#1" not in scheduler.requests:
        engine.step()
    first, second = scheduler.requests["n2#0"], scheduler.requests["n2#1"]
    out = scheduler.schedule()
    rows = dict(zip(out.request_ids, zip(out.num_computed_tokens, out.num_scheduled_tokens)))
    assert rows["n2#1"] == (32, 8) and rows["n2#0"][1] == 1
    assert second.block_table[:2] == first.block_table[:2] and second.block_table[2] != first.block_table[2]


@pytest.mark.parametrize("overlap", [False, True])
def test_an_error_taking_in_one_token_fails_only_its_request(model_dir, overlap):
    llm = LLM(model_dir, dtype="float32", overlap_steps=overlap)
    engine = llm.engine
    real = engine.output._take
    calls = {"n": 0}

    def take(rs, sample, out):
        if rs.request_id == "bad" and out.new_token_ids:
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("injected")
        return real(rs, sample, out)

    engine.output._take = take
    params = SamplingParams(max_tokens=8, **GREEDY)
    for rid in ("a", "bad", "c"):
        engine.add_request(rid, [5, 6, 7], params)
    finals = run_to_end(engine)
    assert "injected" in finals["bad"].error
    assert finals["a"].error is None and finals["c"].error is None
    assert len(finals["a"].outputs[0].token_ids) == len(finals["c"].outputs[0].token_ids) == 8
    assert engine.stats().kv_blocks_used == 0


def test_no_step_is_computed_past_max_tokens(model_dir):
    """A sequence whose last token is in flight is not scheduled again (that row would be
    thrown away): overlapped and synchronous engines run the same number of steps."""
    sync, overlapped = engines(model_dir)
    counts = []
    for llm in (sync, overlapped):
        events = trace(llm)
        llm.generate([[5, 6, 7], [8, 9]], [SamplingParams(max_tokens=5, **GREEDY), SamplingParams(max_tokens=9, **GREEDY)])
        counts.append(events.count("execute"))
    assert counts[0] == counts[1] == 9


@pytest.mark.parametrize("overlap", [False, True])
def test_finished_requests_are_freed_without_the_garbage_collector(model_dir, overlap):
    import gc
    import weakref

    llm = LLM(model_dir, dtype="float32", overlap_steps=overlap)
    engine = llm.engine
    for rid, n in (("one", 1), ("two", 2)):
        engine.add_request(rid, [5, 6, 7], SamplingParams(max_tokens=4, n=n, **GREEDY))
    refs = [weakref.ref(rs) for rs in engine.output.requests.values()]
    gc.collect()
    gc.disable()
    try:
        while engine.has_unfinished():
            engine.step()
        assert [r() for r in refs] == [None, None]  # no cycle keeps a request's state alive
    finally:
        gc.enable()


def test_an_engine_raises_the_collectors_thresholds(model_dir):
    """Its per-step objects die by reference counting, so the cyclic collector runs rarely
    (bench/probes/gc_ab.py)."""
    import gc

    from mlxr.engine.core.gc_tuning import GC_THRESHOLDS

    LLM(model_dir, dtype="float32")
    assert all(now >= want for now, want in zip(gc.get_threshold(), GC_THRESHOLDS))


def test_steady_decode_steps_advance_the_last_ones_arrays(model_dir, monkeypatch):
    """Same sequences, one token on: the runner advances the last step's index arrays. Tokens
    must match the synchronous engine across block boundaries, shared prompt blocks
    (copy-on-write), and sequences that end early (the batch changes, then steadies again)."""
    from mlxr.engine.worker import steady_decode

    advanced = []
    real = steady_decode.SteadyDecode.advance

    def advance(self, out, states, rows):
        arrays = real(self, out, states, rows)
        advanced.append(arrays is not None)
        return arrays

    monkeypatch.setattr(steady_decode.SteadyDecode, "advance", advance)
    prompts = [[5, 6, 7, 8, 9] * 4] * 3 + [[11, 12, 13], [14] * 17]  # three share a prompt
    params = [SamplingParams(max_tokens=n, **GREEDY) for n in (40, 23, 40, 9, 35)]
    sync, overlapped = engines(model_dir)
    want = [o.outputs[0].token_ids for o in sync.generate(prompts, params)]
    got = [o.outputs[0].token_ids for o in overlapped.generate(prompts, params)]
    assert got == want
    assert sum(advanced) > 25 and not all(advanced)  # mostly advanced; rebuilt when the batch changed


class _State:
    """The runner's view of a request, as far as steady decode reads it."""

    def __init__(self, token_ids, block_table):
        self.token_ids, self.block_table = token_ids, block_table


def _decode_step(ids, starts, **kw):
    from mlxr.engine.records import SchedulerOutput

    return SchedulerOutput(request_ids=ids, num_scheduled_tokens=[1] * len(ids), num_computed_tokens=starts, **kw)


def test_steady_decode_rebuilds_a_step_that_swaps_blocks_in():
    """A swapped-in request comes back with new blocks everywhere: the step is rebuilt."""
    from mlxr.engine.worker.steady_decode import SteadyDecode

    states = {"r": _State([1, 2, 3], [7])}
    steady = SteadyDecode(block_size=16)
    steady.remember(_decode_step(["r"], [3]), [7], 1)
    states["r"].token_ids.append(9)  # the token of position 3 landed; position 4's is in flight
    assert steady.advance(_decode_step(["r"], [4], blocks_to_swap_in=[(0, 7)]), states, {"r": 0}) is None
    assert steady.advance(_decode_step(["r"], [4]), states, {"r": 0}) is not None


def test_steady_decode_widens_the_tables_for_a_request_entering_a_new_block():
    """A request past the last step's table width widens the tables (zero padded) instead of
    rebuilding every row."""
    from mlxr.engine.worker.steady_decode import SteadyDecode

    states = {"a": _State(list(range(15)), [7]), "b": _State([1, 2], [4])}
    steady = SteadyDecode(block_size=16)
    steady.remember(_decode_step(["a", "b"], [15, 2]), [7, 4], 1)
    for s in states.values():
        s.token_ids.append(9)
    states["a"].block_table.append(5)
    arrays = steady.advance(_decode_step(["a", "b"], [16, 3]), states, {"a": 1, "b": 0})
    assert arrays is not None
    assert arrays.tables.tolist() == [[7, 5], [4, 0]]
    assert arrays.slots.tolist() == [5 * 16, 4 * 16 + 3]
    assert arrays.positions.tolist() == [16, 3] and arrays.fill_from == [1, 0]


def test_steady_decode_rebuilds_when_a_row_token_is_not_the_one_in_flight():
    from mlxr.engine.worker.steady_decode import SteadyDecode

    states = {"r": _State([1, 2, 3], [7])}
    steady = SteadyDecode(block_size=16)
    steady.remember(_decode_step(["r"], [3]), [7], 1)
    assert steady.advance(_decode_step(["r"], [4]), states, {"r": 0}) is None  # position 3 not landed


@pytest.mark.parametrize("overlap", [False, True])
def test_a_step_whose_landing_raises_fails_its_requests_and_the_engine_goes_on(model_dir, overlap):
    """A bug while the scheduler takes in a step's tokens (as the swap-out race of acf7233 was)
    fails that step's requests with the error; it does not end the engine core, and the next
    request runs as if nothing happened."""
    llm = LLM(model_dir, dtype="float32", overlap_steps=overlap)
    engine = llm.engine
    scheduler = engine.core.core.scheduler
    real = scheduler.update_from_output
    calls = {"n": 0}

    def update(out, result):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected landing fault")
        return real(out, result)

    scheduler.update_from_output = update
    params = SamplingParams(max_tokens=8, **GREEDY)
    for rid in ("a", "b"):
        engine.add_request(rid, [5, 6, 7], params)
    finals = run_to_end(engine)
    assert all("injected landing fault" in (finals[r].error or "") for r in ("a", "b"))
    assert engine.stats().kv_blocks_used == 0
    again = llm.generate([[5, 6, 7]], params)[0]
    assert again.error is None and len(again.outputs[0].token_ids) == 8


def test_a_swap_out_in_a_step_with_no_rows_still_runs(model_dir):
    """Overlapped, a step can schedule nothing but a swap-out: request A's last token is in
    flight (not scheduled again) and B is preempted to make room for A's landing. That step
    used to be dropped as empty, so B's KV never reached the host and came back as whatever
    the host blocks held: B's tokens after its swap-in must equal an unpreempted run's.
    (Found by a review's scheduler fuzzer, /tmp repro of 2026-11-28.)"""
    params_a, params_b = SamplingParams(max_tokens=1, **GREEDY), SamplingParams(max_tokens=4, **GREEDY)
    a, b = list(range(10, 17)), list(range(20, 28))
    roomy = LLM(model_dir, dtype="float32", overlap_steps=True)
    want = [texts(roomy, [a], params_a)[0], texts(roomy, [b], params_b)[0]]
    tight = LLM(model_dir, dtype="float32", overlap_steps=True, num_kv_blocks=4, block_size=4, max_model_len=16,
                swap_space_gb=0.001)
    runner = tight.engine.core.core.runner
    swapped = []
    real_swap_out = runner.kv_cache.swap_out
    runner.kv_cache.swap_out = lambda pairs: (swapped.extend(pairs), real_swap_out(pairs))[1]
    engine = tight.engine
    engine.add_request("a", a, params_a)
    engine.add_request("b", b, params_b)
    finals = run_to_end(engine)
    got = [(finals[r].outputs[0].token_ids, finals[r].outputs[0].text, finals[r].outputs[0].finish_reason)
           for r in ("a", "b")]
    assert tight.engine.stats().num_preemptions > 0 and swapped  # the case happened, and its copy ran
    assert got == want
    assert tight.engine.stats().kv_blocks_used == 0


def test_a_failed_step_publishes_no_block_it_was_to_fill(model_dir):
    """Overlapped, scheduling a step advances its rows' computed counts before it runs; when
    its launch fails, the step before it lands and used to publish, by those counts, the blocks
    the failed step was to fill (never written) to the prefix cache, so a retry of the same
    prompt read them. (Found by a review's scheduler fuzzer.)"""
    prompt = list(range(40, 64))  # 24 tokens: three chunks of 8
    params = SamplingParams(max_tokens=6, **GREEDY)
    kw = dict(block_size=4, max_num_batched_tokens=8, num_kv_blocks=64)
    want = texts(LLM(model_dir, dtype="float32", overlap_steps=True, **kw), [prompt], params)
    llm = LLM(model_dir, dtype="float32", overlap_steps=True, **kw)
    runner = llm.engine.core.core.runner
    real, calls = runner.execute, {"n": 0}

    def execute(out, *rest):
        calls["n"] += 1
        if calls["n"] == 2:  # the prompt's second chunk
            raise RuntimeError("injected launch fault")
        return real(out, *rest)

    runner.execute = execute
    failed = llm.generate([prompt], params)[0]
    assert "injected launch fault" in (failed.error or "")
    assert texts(llm, [prompt], params) == want  # the retry: cached blocks hold what they claim
    assert llm.engine.stats().kv_blocks_used == 0
