"""OutputCollector: deltas a reader has not taken yet merge into one; an error comes after them."""
from __future__ import annotations

import asyncio

from mlxr.engine.frontend.output_collector import OutputCollector
from mlxr.types import CompletionOutput, Logprob, RequestOutput


def delta(text: str, ids: list[int], finish: str | None = None, logprob: bool = False) -> RequestOutput:
    lps = [{i: Logprob(-0.5, 1, str(i))} for i in ids] if logprob else None
    return RequestOutput("r", None, [1, 2], [CompletionOutput(0, text, ids, finish, lps)], finish is not None)


def test_untaken_deltas_merge_in_order_and_the_last_finish_wins():
    async def main():
        c = OutputCollector(asyncio.get_running_loop())
        c.put(delta("a", [5], logprob=True))
        c.put(delta("b", [6], logprob=True))
        c.put(delta("c", [7], "length", logprob=True))
        return await c.get()

    out = asyncio.run(main())
    o = out.outputs[0]
    assert (o.text, o.token_ids, o.finish_reason, out.finished) == ("abc", [5, 6, 7], "length", True)
    assert [next(iter(lp)) for lp in o.logprobs] == [5, 6, 7]


def test_an_error_comes_after_the_output_already_waiting():
    async def main():
        c = OutputCollector(asyncio.get_running_loop())
        c.put(delta("a", [5]))
        c.put(RuntimeError("core died"))
        return await c.get(), await c.get()

    first, second = asyncio.run(main())
    assert first.outputs[0].text == "a" and isinstance(second, RuntimeError)


def test_get_waits_for_a_put():
    async def main():
        c = OutputCollector(asyncio.get_running_loop())
        asyncio.get_running_loop().call_later(0.01, c.put, delta("x", [9]))
        return await asyncio.wait_for(c.get(), 5)

    assert asyncio.run(main()).outputs[0].token_ids == [9]


async def _taken_within(c: OutputCollector, seconds: float = 0.05):
    try:
        return await asyncio.wait_for(c.get(), seconds)
    except asyncio.TimeoutError:
        return None


def test_an_interval_holds_the_reader_until_enough_tokens_wait():
    async def main():
        c = OutputCollector(asyncio.get_running_loop(), stream_interval=3)
        c.put(delta("a", [5]))
        first = await _taken_within(c)  # the first token is never held
        c.put(delta("b", [6]))
        c.put(delta("c", [7]))
        held = await _taken_within(c)
        c.put(delta("d", [8]))
        gathered = await _taken_within(c)
        c.put(delta("e", [9], "length"))  # the end is never held
        last = await _taken_within(c)
        return first, held, gathered, last

    first, held, gathered, last = asyncio.run(main())
    assert first.outputs[0].token_ids == [5] and held is None
    assert gathered.outputs[0].token_ids == [6, 7, 8] and gathered.outputs[0].text == "bcd"
    assert last.finished and last.outputs[0].token_ids == [9]


def test_an_error_wakes_a_held_reader_after_the_held_output():
    async def main():
        c = OutputCollector(asyncio.get_running_loop(), stream_interval=8)
        c.put(delta("a", [5]))
        await c.get()
        c.put(delta("b", [6]))
        c.put(RuntimeError("core died"))
        return await _taken_within(c), await _taken_within(c)

    held, error = asyncio.run(main())
    assert held.outputs[0].token_ids == [6] and isinstance(error, RuntimeError)
