"""Prompt logprobs (SamplingParams.prompt_logprobs) against HF transformers on the same weights."""
from __future__ import annotations

import pytest
import torch

from model_fixtures import cached_llm, fixture_model
from mlxr import LLM, SamplingParams
from mlxr.engine.worker import prompt_logprobs as plp
from prompt_logprobs_reference import PROMPT, hf_prompt_logprobs


def check_against(ref: torch.Tensor, ids: list[int], entries: list, top: int) -> None:
    assert len(entries) == len(ids) and entries[0] is None
    for pos, entry in enumerate(entries[1:], start=1):
        row, token = ref[pos - 1], ids[pos]
        chosen = entry[token]
        assert chosen.logprob == pytest.approx(row[token].item(), abs=2e-4)
        assert chosen.rank == int((row > row[token]).sum()) + 1
        best = row.topk(top)
        alternatives = sorted((lp.rank, t) for t, lp in entry.items() if lp.rank <= top)
        assert [t for _, t in alternatives][:top] == best.indices.tolist()
        for t, value in zip(best.indices.tolist(), best.values.tolist()):
            assert entry[t].logprob == pytest.approx(value, abs=2e-4)
        assert len(entry) <= top + 1


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_prompt_logprobs_match_transformers(name, monkeypatch):
    # Chunks of 5 positions: the logits of a long prompt are taken a chunk at a time.
    monkeypatch.setattr(plp, "LOGIT_ROWS", 5)
    llm = cached_llm(str(fixture_model(name).hf_dir))
    out = llm.generate([PROMPT], SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3))[0]
    check_against(hf_prompt_logprobs(name, PROMPT), PROMPT, out.prompt_logprobs, 3)
    assert len(out.outputs[0].token_ids) == 2


def test_a_greedy_continuation_scores_rank_1_at_every_position():
    llm = cached_llm(str(fixture_model("tiny-llama").hf_dir))
    greedy = llm.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    ids = PROMPT + greedy.outputs[0].token_ids
    scored = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=2))[0].prompt_logprobs
    for pos in range(len(PROMPT), len(ids)):
        entry = scored[pos]
        assert entry[ids[pos]].rank == 1 and len(entry) == 2  # the token is its own best alternative
        assert max(lp.logprob for lp in entry.values()) == entry[ids[pos]].logprob


def test_streamed_requests_carry_them_too():
    import asyncio

    from mlxr.engine.frontend.async_engine import AsyncEngine

    llm = LLM(str(fixture_model("tiny-llama").hf_dir), dtype="float32", engine_process=False)
    ae = AsyncEngine(llm.engine)

    async def run():
        outs = [o async for o in ae.stream("s", PROMPT, SamplingParams(max_tokens=3, prompt_logprobs=1))]
        return outs[-1], await ae.prompt_logprobs(PROMPT, 1)

    try:
        last, (ids, direct) = asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        ae.shutdown()
    assert ids == PROMPT and last.prompt_logprobs == direct and direct[0] is None


def test_the_generation_after_scoring_reuses_the_scored_blocks():
    """Scoring leaves the prompt's full blocks in the prefix cache: the request generating from
    it computes only the rest, and its tokens are those of an engine with no cache."""
    path = str(fixture_model("tiny-llama").hf_dir)
    llm = LLM(path, dtype="float32", engine_process=False, block_size=8)
    prompt = [1] + [(37 * i) % 500 + 3 for i in range(29)]  # 30 tokens: 3 full blocks of 8
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    scored = llm.generate([prompt], SamplingParams(**{**vars(params), "prompt_logprobs": 1}))[0]
    assert scored.num_cached_tokens == 24
    plain = LLM(path, dtype="float32", engine_process=False, block_size=8, enable_prefix_caching=False)
    want = plain.generate([prompt], params)[0]
    assert want.num_cached_tokens == 0
    assert scored.outputs[0].token_ids == want.outputs[0].token_ids


def test_zero_alternatives_gives_the_prompt_tokens_alone():
    llm = cached_llm(str(fixture_model("tiny-llama").hf_dir))
    out = llm.generate([PROMPT[:6]], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    assert [list(e) if e else None for e in out.prompt_logprobs] == [None] + [[t] for t in PROMPT[1:6]]
    one = llm.generate([PROMPT[:1]], SamplingParams(max_tokens=1, prompt_logprobs=2))[0]
    assert one.prompt_logprobs == [None]
    assert llm.generate([PROMPT[:6]], SamplingParams(max_tokens=1))[0].prompt_logprobs is None


def test_an_engine_process_gives_the_same_figures():
    path = str(fixture_model("tiny-llama").hf_dir)
    inproc = cached_llm(path)
    llm = LLM(path, dtype="float32", engine_process=True)
    try:
        params = SamplingParams(max_tokens=1, prompt_logprobs=4)
        got = llm.generate([PROMPT], params)[0].prompt_logprobs
        tail = llm.engine.score_prompt(PROMPT, 2, 15)[1]
    finally:
        llm.shutdown()
    want = inproc.generate([PROMPT], params)[0].prompt_logprobs
    assert got == want
    assert tail == inproc.engine.score_prompt(PROMPT, 2, 15)[1]


def test_scoring_from_a_position_gives_the_tail_of_the_whole(monkeypatch):
    """Perplexity scores a chunk's second half: the lm_head runs for those positions only."""
    monkeypatch.setattr(plp, "LOGIT_ROWS", 4)
    llm = cached_llm(str(fixture_model("tiny-llama").hf_dir))
    _, whole = llm.engine.score_prompt(PROMPT, 3)
    for first in (0, 1, 10, len(PROMPT) - 2):
        ids, tail = llm.engine.score_prompt(PROMPT, 3, first)
        assert ids == PROMPT and len(tail) == len(whole) - first and tail[0].token_id == PROMPT[first + 1]
        for a, b in zip(tail, whole[first:]):  # other rows beside it in the lm_head: the last bits may differ
            assert (a.token_id, a.rank, [t for t, _ in a.top]) == (b.token_id, b.rank, [t for t, _ in b.top])
            assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
    assert llm.engine.score_prompt(PROMPT, 3, len(PROMPT) - 1)[1] == []
    from mlxr.errors import InvalidParameterError

    for bad in (-1, len(PROMPT)):
        with pytest.raises(InvalidParameterError, match="first"):
            llm.engine.score_prompt(PROMPT, 3, bad)


def test_out_of_range_alternatives_are_refused():
    from mlxr.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
