"""OutputCollector: deltas a reader has not taken yet merge into one; an error comes after them."""
from __future__ import annotations

import asyncio

from mlxr.engine.output_collector import OutputCollector
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
