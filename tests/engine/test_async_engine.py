"""AsyncEngine: streamed deltas, abort by closing the stream, faults, embeddings."""
from __future__ import annotations

import asyncio

import pytest

from model_fixtures import fixture_model
from mlxr import LLM, SamplingParams
from mlxr.engine.frontend.async_engine import AsyncEngine
from mlxr.errors import ContextLengthError, EngineDeadError

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture()
def engine():
    llm = LLM(str(fixture_model("tiny-llama").hf_dir), dtype="float32", max_num_batched_tokens=32)
    ae = AsyncEngine(llm.engine)
    yield llm, ae
    ae.shutdown()


async def collect(ae, rid, prompt, params=GREEDY):
    text, ids, last = "", [], None
    async for out in ae.stream(rid, prompt, params):
        text += out.outputs[0].text
        ids += out.outputs[0].token_ids
        last = out
    return text, ids, last


def test_stream_deltas_add_up_to_the_offline_result(engine):
    llm, ae = engine
    want = llm.generate(["Once upon a time", "The sea"], GREEDY)

    async def both():
        return await asyncio.gather(collect(ae, "a", "Once upon a time"), collect(ae, "b", "The sea"))

    got = asyncio.run(asyncio.wait_for(both(), 60))
    for (text, ids, last), ref in zip(got, want):
        assert ids == ref.outputs[0].token_ids and text == ref.outputs[0].text
        assert last.finished and last.outputs[0].finish_reason == "length"
        assert last.metrics.first_token_time >= last.metrics.arrival_time


def test_closing_the_stream_aborts_and_frees_blocks():
    # The long-context fixture: 3,000 tokens cannot all be generated before the close lands.
    ae = AsyncEngine(LLM(str(fixture_model("tiny-llama-long").hf_dir), dtype="float32").engine)

    async def main():
        stream = ae.stream("long", "Once upon a time", SamplingParams(max_tokens=3000, temperature=0, ignore_eos=True))
        async for _ in stream:
            break
        await stream.aclose()
        for _ in range(100):
            if ae.stats().num_aborted:
                break
            await asyncio.sleep(0.02)

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
        stats = ae.stats()
    finally:
        ae.shutdown()
    assert stats.num_aborted == 1 and stats.kv_blocks_used == 0 and stats.num_requests_running == 0


def test_admission_errors_raise_from_stream(engine):
    _, ae = engine

    async def main():
        with pytest.raises(ContextLengthError):
            await collect(ae, "x", list(range(3, 300)), SamplingParams(max_tokens=4))

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(engine):
    llm, ae = engine
    runner = llm.engine.core.core.runner
    real = runner.execute
    calls = {"n": 0}

    def flaky(out, *rest):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return real(out, *rest)

    runner.execute = flaky

    async def main():
        _, _, failed = await collect(ae, "f", "Once upon")
        ok = await collect(ae, "g", "Once upon")
        return failed, ok

    failed, ok = asyncio.run(asyncio.wait_for(main(), 60))
    assert failed.finished and "injected fault" in failed.error
    assert len(ok[1]) == 12 and ae.is_alive
    assert ae.stats().kv_blocks_used == 0


def test_embedding_is_normalised_and_deterministic(engine):
    _, ae = engine
    v1, n = asyncio.run(ae.embed("hello world"))
    v2, _ = asyncio.run(ae.embed("hello world"))
    v3, _ = asyncio.run(ae.embed("something else entirely"))
    assert n > 0 and v1 == v2 and v1 != v3
    assert abs(sum(x * x for x in v1) - 1) < 1e-5


def test_a_caller_cancelled_during_admission_does_not_kill_the_engine(engine):
    _, ae = engine

    async def main():
        task = asyncio.ensure_future(collect(ae, "c", "Once upon"))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await collect(ae, "d", "Once upon")

    _, ids, _ = asyncio.run(asyncio.wait_for(main(), 60))
    assert len(ids) == 12 and ae.is_alive


def test_work_sent_to_a_stopped_engine_fails_fast(engine):
    from mlxr.errors import OverloadedError

    _, ae = engine
    ae.shutdown()

    async def main():
        with pytest.raises(OverloadedError):
            await collect(ae, "late", "Once upon")
        with pytest.raises(OverloadedError):
            await ae.embed("hello")

    asyncio.run(asyncio.wait_for(main(), 10))


def test_cpu_threads_apply_on_the_engine_thread(engine):
    """Ollama's num_thread: the model's ops run on the engine thread, so the setting must land
    there (torch's thread count is per OS thread), and None restores the load-time default."""
    from concurrent.futures import Future

    import torch

    from mlxr.engine.frontend.async_engine import _Call

    llm, ae = engine
    want = llm.generate(["Once upon a time"], GREEDY)[0].outputs[0].text  # before the engine thread runs

    async def engine_threads() -> int:
        call = _Call(torch.get_num_threads, Future())
        ae._submit(calls=[call])
        return await asyncio.wrap_future(call.result)

    async def run():
        assert await ae.use_cpu_threads(1)
        one = await engine_threads()
        text, _, _ = await collect(ae, "t1", "Once upon a time")
        assert await ae.use_cpu_threads(None)
        return one, await engine_threads(), text

    one, back, text = asyncio.run(asyncio.wait_for(run(), 60))
    assert one == 1 and back == ae.default_threads
    assert text == want


def test_a_reader_that_falls_behind_gets_merged_deltas_adding_up_to_the_same_result(engine):
    llm, ae = engine
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    want = llm.generate(["Once upon a time"], params)[0].outputs[0]

    async def slow_reader():
        outs = []
        async for out in ae.stream("slow", "Once upon a time", params):
            outs.append(out)
            await asyncio.sleep(0.05)  # several engine steps land meanwhile
        return outs

    outs = asyncio.run(asyncio.wait_for(slow_reader(), 60))
    assert [t for o in outs for t in o.outputs[0].token_ids] == want.token_ids
    assert "".join(o.outputs[0].text for o in outs) == want.text
    assert len(outs) < len(want.token_ids)  # without merging: one output per step
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "length"
    assert not any(o.finished for o in outs[:-1])


def test_an_abort_that_fails_while_failing_requests_leaves_no_stream_waiting(engine):
    """A step that raises fails every request; an abort that raises on the way (a core that
    died between two calls did) must not leave the other streams waiting for ever."""
    llm, ae = engine
    engine_ = llm.engine
    real_abort = engine_.abort

    def step():
        raise RuntimeError("injected fault")

    def abort(rid):
        if rid == "a":
            raise RuntimeError("the core is gone")
        return real_abort(rid)

    async def main():
        streams = [asyncio.ensure_future(collect(ae, rid, "Once upon")) for rid in ("a", "b", "c")]
        return await asyncio.gather(*streams, return_exceptions=True)

    engine_.step, engine_.abort = step, abort
    results = asyncio.run(asyncio.wait_for(main(), 30))
    assert [str(r) for r in results] == ["injected fault"] * 3, results
    assert ae.is_alive  # the streams closing sent aborts that raised too: logged, the thread goes on


def test_requests_left_when_the_core_is_found_dead_get_the_core_error(engine):
    """The core died between a step and the check after it: the requests the frontend had not
    failed yet end with the dead core's error (a 503 naming the core), not a bare shutdown."""
    llm, ae = engine
    llm.engine.core.alive = lambda: False  # the next check finds the core gone

    async def main():
        try:
            await collect(ae, "a", "Once upon")
        except EngineDeadError as e:
            return e
        return None

    error = asyncio.run(asyncio.wait_for(main(), 30))
    assert isinstance(error, EngineDeadError) and "engine core" in str(error) and error.status == 503
