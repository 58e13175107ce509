"""Lossless sampling: with drafts (any proposer) the tokens are distributed exactly as without.
20,000 samples of the first three tokens (top_k=4 at temperature 1: 64 outcomes) against the
probabilities the plain engine's own logprobs give, by a chi-square test."""
from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

from model_fixtures import cached_llm, fixture_model
from mlxr import LLM, SamplingParams

SAMPLES = 20_000
TOP_K = 4


def looping_prompt(llm: LLM) -> list[int]:
    """A prompt whose greedy continuation repeats its last token: prompt lookup drafts it, and
    the draft is likely under the model (the accept path runs, not only the reject path)."""
    for seed in range(50):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(3, 500, (12,), generator=g).tolist()
        out = llm.generate([ids], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))[0].outputs[0]
        tail = out.token_ids[-4:]
        if len(set(tail)) == 1:
            return ids + out.token_ids
    raise AssertionError("no looping prompt found")


def exact_distribution(llm: LLM, prompt: list[int], structured=None) -> dict[tuple[int, ...], float]:
    """P(t1, t2, t3) under top_k=4, temperature 1, from the plain engine's top-4 logprobs
    (structured: each prefix's under a fresh grammar; the logprobs are the allowed tokens')."""
    def top(prefix: list[int]) -> dict[int, float]:
        params = SamplingParams(max_tokens=1, temperature=0, logprobs=TOP_K, structured_outputs=structured)
        lp = llm.generate([prefix], params)[0]
        pos = lp.outputs[0].logprobs[0]
        z = sum(math.exp(v.logprob) for v in pos.values())
        return {t: math.exp(v.logprob) / z for t, v in pos.items()}

    out = {}
    for t1, p1 in top(prompt).items():
        for t2, p2 in top(prompt + [t1]).items():
            for t3, p3 in top(prompt + [t1, t2]).items():
                out[(t1, t2, t3)] = p1 * p2 * p3
    return out


def chi_square_p(counts: Counter, probs: dict, n: int) -> float:
    assert set(counts) <= set(probs), set(counts) - set(probs)
    stat = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in probs.items())
    df = len(probs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ngram", "suffix", "draft"])
def test_speculative_sampling_distribution_equals_plain(method):
    model = str(fixture_model("tiny-llama").hf_dir)
    plain = cached_llm(model)
    prompt = looping_prompt(plain)
    probs = exact_distribution(plain, prompt)
    # Another model of the same vocabulary: its q differs from p, so drafts are both kept and
    # rejected (the target drafting for itself has q == p: every draft is kept).
    extra = {"speculative_draft_model": str(fixture_model("tiny-llama-tied").hf_dir)} if method == "draft" else {}
    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=TOP_K, ignore_eos=True)
    assert_sampled_as(probs, model, prompt, params, speculative_method=method, **extra)


def assert_sampled_as(probs: dict, model: str, prompt: list[int], params: SamplingParams, **spec_args) -> None:
    """SAMPLES speculative draws of the first three tokens pass the chi-square test against
    probs, with drafts both kept and rejected."""
    # speculative_max_batch past the 1,000 requests of a call: the queued ones count towards it;
    # the fixed cut-off, not the device's step costs: every row drafts, whatever acceptance it has.
    spec = LLM(model, dtype="float32", num_speculative_tokens=3, max_num_seqs=512, speculative_max_batch=1024,
               speculative_cost_table="none",
               max_num_batched_tokens=8192, **spec_args)
    counts: Counter = Counter()
    for _ in range(SAMPLES // 1000):
        for o in spec.generate([prompt] * 1000, params):
            counts[tuple(o.outputs[0].token_ids)] += 1
    s = spec.engine.stats()
    assert s.spec_num_accepted_tokens > 0.02 * SAMPLES and s.spec_num_draft_tokens > s.spec_num_accepted_tokens
    assert chi_square_p(counts, probs, SAMPLES) > 0.01


@pytest.mark.slow
def test_speculative_sampling_under_a_grammar_equals_plain():
    """With a grammar, each drafted position under its own mask: the first three tokens of
    [ab]{30} are distributed as without drafts. Every token of only a's and b's is allowed at
    each of those positions whatever came before (the language is closed under concatenation
    there and no end is allowed yet), so a fresh grammar after a prefix gives the plain
    engine's exact probabilities. The prompt's spaced words make the lookup also draft tokens
    the grammar refuses."""
    from mlxr.types import StructuredOutputsParams

    model = str(fixture_model("tiny-llama").hf_dir)
    plain = cached_llm(model)
    grammar = StructuredOutputsParams(regex="[ab]{30}")
    free = SamplingParams(max_tokens=12, temperature=1.0, top_k=TOP_K, seed=0, structured_outputs=grammar)
    text = plain.generate([[1]], free)[0].outputs[0].text  # the model's own likely a/b tokens
    prompt = plain.tokenizer.encode(f"{text} {text} ab ba {text}", add_special_tokens=False)
    # The fixture's vocabulary holds three such tokens: a top-4 list's fourth is banned (p = 0).
    probs = {k: p for k, p in exact_distribution(plain, prompt, grammar).items() if p > 0}
    assert len(probs) >= 8
    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=TOP_K, structured_outputs=grammar)
    assert_sampled_as(probs, model, prompt, params, speculative_method="ngram")


def test_chi_square_detects_a_wrong_distribution():
    """The statistic has power at this sample size: a 10% shift of mass is caught."""
    probs = {k: 1 / 64 for k in itertools.product(range(4), repeat=3)}
    skewed = {k: (1.1 if k[0] == 0 else 0.9) for k in probs}
    z = sum(skewed.values())
    g = torch.Generator().manual_seed(0)
    keys = list(probs)
    draws = torch.multinomial(torch.tensor([skewed[k] / z for k in keys]), SAMPLES, True, generator=g).tolist()
    counts = Counter(keys[i] for i in draws)
    assert chi_square_p(counts, probs, SAMPLES) < 0.01
