"""Prefix caching for hybrid models (tiny random Qwen3.5 dense and MoE): a second request
sharing a cached prefix resumes from the recurrent-state checkpoint kept at the first prompt's
last full block (sched/state_prefix.py) and gives exactly the tokens of a cold run with the
cache off, computing only what the checkpoint does not cover."""
from __future__ import annotations

import pytest

from hf_compare import PROMPT
from model_fixtures import FIXTURES, cached_llm

from mlxr import SamplingParams

BLOCK = 4
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def fixture_dir(name: str):
    from mlxr.testing.hybrid_fixtures import hybrid_fixture_dir

    return hybrid_fixture_dir(name, FIXTURES)


@pytest.fixture(scope="module", params=["tiny-qwen35", "tiny-qwen35moe"])
def variant(request) -> str:
    return request.param


def _llm(variant, **kwargs):
    return cached_llm(str(fixture_dir(variant)), block_size=BLOCK, **kwargs)


def _tokens(c: int, n: int) -> list[int]:
    """Case c's own tokens (no case's chain meets another's), n of them."""
    return [(t + 50 * c) % 400 + 1 for t in (PROMPT * 2)[:n]]


# (first prompt's length, shared prefix, second prompt's length, tokens the second finds cached):
# the checkpoint sits at the first prompt's last full block short of its last token.
CASES = {
    "one block": (5, 5, 9, 4),
    "several blocks": (13, 13, 18, 12),
    "whole prompt but one token": (17, 17, 17, 16),
    "block-unaligned": (14, 14, 19, 12),
    "blocks cached, no checkpoint reached": (13, 10, 15, 0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_shared_prefix_resumes_from_its_checkpoint_exactly(variant, case):
    first_len, shared, second_len, cached = CASES[case]
    c = list(CASES).index(case) + (10 if variant.endswith("moe") else 0)
    first = _tokens(c, first_len)
    second = first[:shared] + _tokens(c + 20, second_len - shared)
    warm, cold = _llm(variant), _llm(variant, enable_prefix_caching=False)
    core = warm.engine.core.core
    warm.generate([first], GREEDY)
    hits = core.scheduler.counters.prefix_hit_tokens
    out = warm.generate([second], GREEDY)[0]
    assert out.num_cached_tokens == cached
    assert core.scheduler.counters.prefix_hit_tokens - hits == cached
    assert out.outputs[0].token_ids == cold.generate([second], GREEDY)[0].outputs[0].token_ids
