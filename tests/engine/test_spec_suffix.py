"""Suffix decoding: the depth-bounded suffix tree against brute-force substring counts (built
token by token and with removals), the proposer's two trees and their bounds (a hostile 100k
token prompt), and greedy output token-identical with and without it in the engine."""
from __future__ import annotations

import random
import resource
import time
from collections import Counter

import pytest

from model_fixtures import cached_llm, fixture_model
from test_spec_decode import generate, looping_requests
from test_engine_e2e import staggered
from mlxr import LLM, SamplingParams
from mlxr.config import SuffixConfig
from mlxr.engine.spec_decode.proposer import DraftRequest
from mlxr.engine.spec_decode.suffix import SuffixProposer
from mlxr.engine.spec_decode.suffix_tree import ROOT, Cursor, SuffixTree


def substring_counts(seqs: list[list[int]], depth: int) -> Counter:
    counts: Counter = Counter()
    for seq in seqs:
        for i in range(len(seq)):
            for j in range(i + 1, min(len(seq), i + depth) + 1):
                counts[tuple(seq[i:j])] += 1
    return counts


def tree_counts(tree: SuffixTree) -> Counter:
    out: Counter = Counter()
    stack = [(ROOT, ())]
    while stack:
        node, path = stack.pop()
        for token, child in (tree.children[node] or {}).items():
            out[path + (token,)] = tree.counts[child]
            stack.append((child, path + (token,)))
    return out


def brute_guess(seqs: list[list[int]], context: list[int], depth: int, k: int, alpha: float,
                min_prob: float) -> tuple[list[set[int]], bool]:
    """The longest context suffix (of at most depth - 1 - k tokens) seen with a continuation,
    then the most frequent next token while the running product of its share stays >= min_prob.
    Returns the allowed tokens at each position and whether the length is exact (a tie ends
    the comparison: which of the tied tokens is taken is the tree's choice)."""
    counts = substring_counts(seqs, depth)

    def follow(path: tuple) -> dict[int, int]:
        return {p[-1]: c for p, c in counts.items() if len(p) == len(path) + 1 and p[:-1] == path}

    match = next((n for n in range(min(len(context), max(1, depth - 1 - k)), 0, -1) if follow(tuple(context[-n:]))), 0)
    path, allowed, prob = tuple(context[-match:]) if match else (), [], 1.0
    while match and len(allowed) < min(k, int(alpha * match)) and (nxt := follow(path)):
        best = max(nxt.values())
        prob *= best / sum(nxt.values())
        if prob < min_prob:
            break
        tied = {t for t, c in nxt.items() if c == best}
        allowed.append(tied)
        if len(tied) > 1:
            return allowed, False
        path += tuple(tied)
    return allowed, True


@pytest.mark.parametrize("depth", [2, 4, 7])
def test_counts_equal_substring_counts_grown_in_pieces_and_after_removal(depth):
    rng = random.Random(depth)
    tree = SuffixTree(depth)
    seqs = []
    for _ in range(4):
        seq, cursor = [], Cursor()
        for _ in range(rng.randint(5, 40)):  # pieces as a request grows: 1 token or a few kept drafts
            piece = [rng.randrange(4) for _ in range(rng.choice((1, 1, 3)))]
            tree.extend(cursor, piece)
            seq += piece
        seqs.append(seq)
        assert tree_counts(tree) == substring_counts(seqs, depth)
    tree.remove(seqs[1])
    assert tree_counts(tree) == substring_counts([seqs[0], seqs[2], seqs[3]], depth)
    for s in (seqs[0], seqs[2], seqs[3]):
        tree.remove(s)
    assert tree.num_nodes == 1 and not tree.children[ROOT]
    tree.extend(Cursor(), seqs[2])  # freed nodes are reused
    assert tree_counts(tree) == substring_counts([seqs[2]], depth)


def test_guess_follows_the_most_frequent_continuation_of_the_longest_match():
    rng = random.Random(1)
    for trial in range(60):
        depth = rng.choice((3, 5, 8))
        seqs = [[rng.randrange(5) for _ in range(rng.randint(3, 30))] for _ in range(rng.randint(1, 3))]
        tree = SuffixTree(depth)
        for s in seqs:
            tree.extend(Cursor(), s)
        context = [rng.randrange(5) for _ in range(rng.randint(1, 6))]
        k, alpha, min_prob = rng.randint(1, 6), rng.choice((0.5, 1.0, 2.0)), rng.choice((0.0, 0.3, 0.6))
        got = tree.guess(context, k, alpha, min_prob).token_ids
        want, exact = brute_guess(seqs, context, depth, k, alpha, min_prob)
        assert all(t in w for t, w in zip(got, want)), (trial, seqs, context, got, want)
        assert len(got) == len(want) if exact else len(got) >= len(want), (trial, seqs, context, got, want)


def small_config(**kw) -> SuffixConfig:
    base = dict(max_depth=8, window=4096, max_request_nodes=1 << 15, cache_responses=4, cache_nodes=1 << 15)
    return SuffixConfig(**{**base, **kw})


def ask(p: SuffixProposer, rid: str, tokens: list[int], k: int = 4, prompt: int = 0) -> list[int]:
    (draft,) = p.propose([DraftRequest(rid, tokens, k, SamplingParams(), prompt)])
    return draft.token_ids


def test_the_request_tree_drafts_what_followed_and_the_shared_tree_a_finished_output():
    p = SuffixProposer(small_config())
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    tokens = prompt + [1, 2, 3]
    assert ask(p, "a", tokens, prompt=len(prompt)) == [4, 5, 6]  # alpha 1: a 3-token match drafts 3
    assert ask(p, "a", tokens, k=2, prompt=len(prompt)) == [4, 5]
    tokens += [4, 5, 6, 7, 8]
    assert ask(p, "a", tokens, k=4, prompt=len(prompt))[:1] == [9]
    output = [40, 41, 42, 43, 44, 45, 46]
    finished = [100, 101] + output
    assert ask(p, "b", finished, prompt=2) == []
    p.retain({"a"})  # "b" finished: its output joins the shared tree
    assert ask(p, "c", [7, 40, 41, 42], prompt=1) == [43, 44, 45]
    p.retain(set())
    assert list(p._cached) == ["b", "a", "c"] and not p._requests


def test_the_shared_tree_keeps_the_latest_outputs_within_its_bounds():
    p = SuffixProposer(small_config(cache_responses=3, cache_nodes=400))
    rng = random.Random(2)
    outputs = {}
    for i in range(40):
        outputs[f"r{i}"] = [rng.randrange(1000) for _ in range(rng.randint(8, 30))]
        ask(p, f"r{i}", [0] + outputs[f"r{i}"], prompt=1)
        p.retain(set())
        assert len(p._cached) <= 3 and p.cache.num_nodes <= 400
    kept = list(p._cached)
    assert kept == [f"r{i}" for i in range(40 - len(kept), 40)]  # least recently finished go first
    assert tree_counts(p.cache) == substring_counts([outputs[r] for r in kept], 8)
    assert ask(p, "new", [5] + outputs["r39"][:4]) == outputs["r39"][4:7]  # a 3-token match: 3 drafts


def test_no_shared_tree_when_caching_is_off():
    p = SuffixProposer(small_config(cache_responses=0))
    ask(p, "a", [9, 1, 2, 3, 4, 5], prompt=1)
    p.retain(set())
    assert ask(p, "b", [1, 2, 3]) == [] and p.cache.num_nodes == 1


@pytest.mark.parametrize("kind", ["repetitive", "random"])
def test_a_hostile_100k_token_prompt_stays_within_the_bounds(kind):
    """A 100k-token prompt, repeating a phrase or random, then 2,000 decode steps: the request's
    tree indexes its window and rebuilds itself past its node bound; time and memory stay small."""
    rng = random.Random(3)
    phrase = [rng.randrange(50_000) for _ in range(7)]
    prompt = (phrase * 15_000)[:100_000] if kind == "repetitive" else [rng.randrange(50_000) for _ in range(100_000)]
    config = SuffixConfig(max_depth=24, window=4096, max_request_nodes=1 << 16, cache_responses=8, cache_nodes=1 << 16)
    p = SuffixProposer(config)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    tokens = list(prompt)
    biggest = 0
    for step in range(2_000):
        draft = ask(p, "h", tokens, k=8, prompt=len(prompt))
        tokens += draft[:2] if draft else [rng.randrange(50_000)]
        biggest = max(biggest, p._requests["h"].tree.num_nodes)
    p.retain(set())
    elapsed = time.perf_counter() - t0
    assert biggest <= config.max_request_nodes + config.max_depth
    assert p.cache.num_nodes <= config.cache_nodes
    assert elapsed < 10, elapsed  # ~1 s on an idle 2-core host
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200_000  # KiB: the trees' bounds, not 100k x 24 nodes
    assert 1 < p.cache.num_nodes  # the finished output went to the shared tree


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_suffix_greedy_is_token_identical_batched(name):
    model = str(fixture_model(name).hf_dir)
    reqs = looping_requests(12, seed=len(name))
    want = generate(cached_llm(model), reqs)
    spec = LLM(model, dtype="float32", speculative_method="suffix", num_speculative_tokens=4, max_num_seqs=16,
               speculative_max_batch=16)
    assert generate(spec, reqs) == want
    assert generate(spec, reqs) == want  # again: now the shared tree holds every output
    s = spec.engine.stats()
    assert s.spec_num_draft_tokens > 0 and s.spec_num_accepted_tokens > 0, s


def test_suffix_under_preemption_and_overlap_is_token_identical():
    model = str(fixture_model("tiny-llama").hf_dir)
    reqs = looping_requests(16, seed=3)
    want = generate(cached_llm(model), reqs)
    spec = LLM(model, dtype="float32", speculative_method="suffix", num_kv_blocks=24, block_size=4,
               max_num_batched_tokens=64, max_num_seqs=16, swap_space_gb=0.001, overlap_steps=True,
               speculative_max_batch=16)
    assert staggered(spec, reqs, per_step=4)[0] == want
    s = spec.engine.stats()
    assert s.num_preemptions > 0 and s.spec_num_accepted_tokens > 0 and s.kv_blocks_used == 0


def test_a_repeated_answer_is_drafted_from_the_shared_tree():
    """A request whose prompt does not hold its answer: the second time round the finished
    first answer is in the shared tree, so it drafts (and the tokens are the same)."""
    model = str(fixture_model("tiny-llama").hf_dir)
    spec = LLM(model, dtype="float32", speculative_method="suffix", num_speculative_tokens=4)
    prompt = [[11, 57, 203, 9, 388]]
    params = SamplingParams(max_tokens=40, **{"temperature": 0.0, "ignore_eos": True})
    first = spec.generate(prompt, params)[0].outputs[0].token_ids
    before = spec.engine.stats().spec_num_accepted_tokens
    assert spec.generate([prompt[0] + [1]], SamplingParams(max_tokens=1, temperature=0.0))  # another request between
    again = spec.generate(prompt, params)[0].outputs[0].token_ids
    assert again == first == cached_llm(model).generate(prompt, params)[0].outputs[0].token_ids
    assert spec.engine.stats().spec_num_accepted_tokens - before > 20
