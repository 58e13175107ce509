"""Speculative decoding on tiny random models: greedy output token-identical with and without
drafts (batching, preemption, swap, prefix cache, overlap, both proposers), sampling features
(seeds, n > 1, logprobs, stop strings), opt-out, batch turn-down, a draft model that fails."""
from __future__ import annotations

import random

import pytest
import torch

from model_fixtures import cached_llm, fixture_model
from test_engine_e2e import staggered
from mlxr import LLM, SamplingParams
from mlxr.engine.spec_decode.ngram import NgramProposer
from mlxr.engine.spec_decode.proposer import DraftRequest

GREEDY = dict(temperature=0.0, ignore_eos=True)


def looping_requests(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """Prompts that repeat a phrase (prompt lookup finds drafts), of mixed lengths."""
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        phrase = [rng.randrange(3, 500) for _ in range(rng.randint(3, 8))]
        reqs.append((phrase * rng.randint(2, 4) + phrase[: rng.randint(1, 3)], rng.randint(8, 40)))
    return reqs


def generate(llm: LLM, reqs, **params) -> list[list[int]]:
    sps = [SamplingParams(max_tokens=n, **{**GREEDY, **params}) for _, n in reqs]
    return [o.outputs[0].token_ids for o in llm.generate([ids for ids, _ in reqs], sps)]


def test_ngram_lookup_takes_the_latest_longest_match():
    p = NgramProposer(max_ngram=3, min_ngram=1, window=64)
    assert p.lookup([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3], 3) == [7, 8, 5]  # "2 3" latest, not "3" alone
    assert p.lookup([4, 5, 6], 2) == []
    assert p.lookup([1, 2, 1, 2], 5) == [1, 2]  # runs into the suffix, never past the end
    assert NgramProposer(max_ngram=2, window=5).lookup([7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8], 2) == []  # outside the window


def scan_lookup(tokens: list[int], k: int, max_n: int, min_n: int, window: int) -> list[int]:
    """The lookup by a plain scan of the window (what the incremental index must equal)."""
    seq = tokens[-window:]
    if k <= 0 or len(tokens) <= min_n:
        return []
    for n in range(min(max_n, len(seq) - 1), min_n - 1, -1):
        starts = [s for s in range(len(seq) - n) if seq[s:s + n] == seq[-n:]]
        if starts:
            return seq[starts[-1] + n: starts[-1] + n + k]
    return []


@pytest.mark.parametrize("max_n,min_n,window", [(4, 2, 2048), (3, 1, 64), (2, 2, 9)])
def test_ngram_index_grown_step_by_step_equals_a_scan(max_n, min_n, window):
    rng = random.Random(max_n * 100 + window)
    p = NgramProposer(max_ngram=max_n, min_ngram=min_n, window=window)
    for trial in range(20):
        tokens = [rng.randrange(6) for _ in range(rng.randint(0, 5))]
        rid = f"r{trial}"
        for _ in range(120):  # as a request grows: one token, or a few accepted drafts at once
            tokens += [rng.randrange(6) for _ in range(rng.choice((1, 1, 3)))]
            k = rng.randint(0, 5)
            (draft,) = p.propose([DraftRequest(rid, tokens, k, SamplingParams())])
            assert draft.token_ids == scan_lookup(tokens, k, max_n, min_n, window), (tokens, k)
    p.retain({"r19"})
    assert list(p._indexes) == ["r19"]


def test_ngram_index_starts_over_for_a_shorter_sequence():
    """A sequence shorter than the one indexed is another sequence: its lookups must not see
    the old n-grams (the stale index would draft [9, 9] here)."""
    p = NgramProposer(max_ngram=2, min_ngram=1, window=64)
    old = [1, 2, 9, 9, 3, 4, 5, 6, 7, 8, 1, 2]
    (draft,) = p.propose([DraftRequest("r", old, 2, SamplingParams())])
    assert draft.token_ids == [9, 9]
    for tokens in ([5, 1, 2, 4, 1, 2], [5, 1, 2, 4, 1, 2, 4]):
        (draft,) = p.propose([DraftRequest("r", tokens, 2, SamplingParams())])
        assert draft.token_ids == scan_lookup(tokens, 2, 2, 1, 64)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gemma3", "tiny-mistral"])
def test_ngram_greedy_is_token_identical_batched(name):
    model = str(fixture_model(name).hf_dir)
    reqs = looping_requests(12, seed=len(name))
    want = generate(cached_llm(model), reqs)
    spec = LLM(model, dtype="float32", speculative_method="ngram", num_speculative_tokens=4, max_num_seqs=16,
               speculative_max_batch=16)
    assert generate(spec, reqs) == want
    s = spec.engine.stats()
    assert s.spec_num_draft_tokens > 0 and s.spec_num_accepted_tokens > 0, s
    assert s.spec_num_accepted_tokens == sum(s.spec_accepted_per_position)


@pytest.mark.parametrize("swap,prefix", [(0.0, False), (0.001, False), (0.001, True)])
def test_ngram_under_preemption_and_overlap_is_token_identical(swap, prefix):
    model = str(fixture_model("tiny-llama").hf_dir)
    reqs = looping_requests(16, seed=3)
    want = generate(cached_llm(model), reqs)
    spec = LLM(model, dtype="float32", speculative_method="ngram", num_kv_blocks=24, block_size=4,
               max_num_batched_tokens=64, max_num_seqs=16, swap_space_gb=swap, enable_prefix_caching=prefix,
               overlap_steps=True, speculative_max_batch=16)
    assert staggered(spec, reqs, per_step=4)[0] == want
    s = spec.engine.stats()
    assert s.num_preemptions > 0 and s.spec_num_accepted_tokens > 0 and s.kv_blocks_used == 0


def test_prefix_cache_and_batch_turn_down():
    model = str(fixture_model("tiny-llama").hf_dir)
    reqs = looping_requests(10, seed=5)
    shared = [(list(range(10, 42)) + ids, n) for ids, n in reqs]  # two shared blocks: cache hits
    want = generate(cached_llm(model), shared)
    drafted = {}
    for limit in (2, 16):
        llm = LLM(model, dtype="float32", speculative_method="ngram", speculative_max_batch=limit, max_num_seqs=16,
                  speculative_cost_table="none")  # the fixed cut-off, not the measured costs
        assert generate(llm, shared[:1]) == want[:1]  # fills the prefix cache
        alone = llm.engine.stats().spec_num_drafts
        assert generate(llm, shared) == want
        assert llm.engine.stats().prefix_cache_hit_tokens > 0
        drafted[limit] = llm.engine.stats().spec_num_drafts - alone
    assert 0 < drafted[2] < drafted[16] / 2  # above the limit (most of the batch's steps) nothing is drafted


def test_requests_waiting_for_admission_count_towards_the_batch_limit():
    """While the batch is still filling up (requests queued), nothing drafts: a drafting step
    lands before the next is scheduled, which would slow the admissions down."""
    from mlxr.engine.records import EngineCoreRequest
    from mlxr.engine.sched.request import Request
    from mlxr.engine.spec_decode.speculator import Speculator

    prompt = [5, 6, 7, 8, 5, 6, 7]  # "5 6 7" repeats: the n-gram lookup drafts "8 ..."
    req = Request(EngineCoreRequest("r", prompt, SamplingParams(max_tokens=8, temperature=0.0), 8, [], 0.0))
    req.num_computed_tokens = len(prompt) - 1
    spec = Speculator(NgramProposer(), max_drafts=3, max_batch=2)
    spec.propose([req], waiting=2)
    assert req.spec_token_ids == []
    spec.propose([req], waiting=1)
    assert req.spec_token_ids[:1] == [8]


def test_a_request_whose_lookups_miss_rests_before_drafting_again():
    """An empty lookup costs the step its overlap (it landed first for nothing): the request
    then lets as many steps run overlapped as it has missed in a row (at most MAX_REST) before
    it asks for a landing again, and a hit ends the run of misses."""
    from mlxr.engine.records import EngineCoreRequest, SchedulerOutput
    from mlxr.engine.sched.request import Request
    from mlxr.engine.spec_decode.speculator import MAX_REST, Speculator

    prompt = [5, 6, 7, 8, 9, 10, 11]  # no repeat: the lookup finds nothing
    req = Request(EngineCoreRequest("r", prompt, SamplingParams(max_tokens=64, temperature=0.0), 64, [], 0.0))
    req.num_computed_tokens = len(prompt) - 1  # decoding: one token left to compute
    spec = Speculator(NgramProposer(), max_drafts=3, max_batch=2)

    def step() -> bool:
        """One step as the engine core runs it under overlap: landed first, or a token in flight."""
        landed = spec.needs_landed_tokens([req], SchedulerOutput())
        req.num_in_flight = 0 if landed else 1
        req.num_computed_tokens = len(req.token_ids) - 1 + req.num_in_flight  # one token left to compute
        spec.propose([req])
        return landed

    landed_at = [i for i in range(12) if step()]
    assert MAX_REST == 1
    assert landed_at == [0, 2, 4, 6, 8, 10]  # each miss: one overlapped step before the next lookup
    assert req.spec_token_ids == []
    req.token_ids += [5, 6]  # "5 6" repeats now: the next lookup drafts what followed it
    while not step():
        pass
    assert req.spec_token_ids == [7, 8, 9] and "r" not in spec._misses


def test_opt_out_drafts_nothing():
    model = str(fixture_model("tiny-llama").hf_dir)
    reqs = looping_requests(4, seed=7)
    spec = LLM(model, dtype="float32", speculative_method="ngram")
    assert generate(spec, reqs, speculative=False) == generate(cached_llm(model), reqs)
    assert spec.engine.stats().spec_num_drafts == 0


@pytest.mark.parametrize("draft", ["tiny-llama", "tiny-llama-tied"])
def test_draft_model_greedy_is_token_identical(draft):
    model = str(fixture_model("tiny-llama").hf_dir)
    reqs = looping_requests(8, seed=11)
    want = generate(cached_llm(model), reqs)
    spec = LLM(model, dtype="float32", speculative_method="draft", num_speculative_tokens=3,
               speculative_draft_model=str(fixture_model(draft).hf_dir))
    assert generate(spec, reqs) == want
    s = spec.engine.stats()
    assert s.spec_num_draft_tokens > 0
    if draft == "tiny-llama":  # the model drafting for itself: drafts are kept (but for near-ties
        assert s.spec_num_accepted_tokens >= 0.95 * s.spec_num_draft_tokens  # between shapes' rounding)


def test_sampling_features_with_drafts():
    """Seeds repeat, n > 1 runs, logprobs match the plain engine's, stop strings cut."""
    model = str(fixture_model("tiny-llama").hf_dir)
    plain = cached_llm(model)
    spec = LLM(model, dtype="float32", speculative_method="ngram")
    ids = looping_requests(1, seed=13)[0][0]
    lp = SamplingParams(max_tokens=24, logprobs=3, **GREEDY)
    a, b = plain.generate([ids], lp)[0].outputs[0], spec.generate([ids], lp)[0].outputs[0]
    assert a.token_ids == b.token_ids
    for x, y in zip(a.logprobs, b.logprobs):
        assert x.keys() == y.keys()
        for t in x:
            assert abs(x[t].logprob - y[t].logprob) < 1e-3
    seeded = SamplingParams(max_tokens=24, temperature=0.8, seed=7, n=3, ignore_eos=True)
    first = [c.token_ids for c in spec.generate([ids], seeded)[0].outputs]
    again = [c.token_ids for c in spec.generate([ids], seeded)[0].outputs]
    assert first == again and len(first) == 3 and all(len(t) == 24 for t in first)
    text = plain.generate([ids], SamplingParams(max_tokens=24, **GREEDY))[0].outputs[0].text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    if stop.strip():
        want = plain.generate([ids], SamplingParams(max_tokens=24, stop=[stop], **GREEDY))[0].outputs[0].text
        got = spec.generate([ids], SamplingParams(max_tokens=24, stop=[stop], **GREEDY))[0].outputs[0].text
        assert got == want and stop not in got


def test_failing_draft_model_turns_speculation_off_and_requests_finish():
    model = str(fixture_model("tiny-llama").hf_dir)
    reqs = looping_requests(6, seed=17)
    want = generate(cached_llm(model), reqs)
    spec = LLM(model, dtype="float32", speculative_method="draft", num_speculative_tokens=3,
               speculative_draft_model=model)
    proposer = spec.engine.core.core.speculator.proposer
    engine = spec.engine
    for i, (ids, n) in enumerate(reqs):
        engine.add_request(f"f{i}", ids, SamplingParams(max_tokens=n, **GREEDY))
    finals = {}
    for _ in range(3):
        engine.step()
    drafted = engine.stats().spec_num_draft_tokens
    assert drafted > 0
    # A real fault: the draft's embedding loses its rows, so its next forward raises.
    embed = next(m for m in proposer.model.modules() if isinstance(m, torch.nn.Embedding))
    embed.weight.data = embed.weight.data[:1]
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out.outputs[0].token_ids
    assert [finals[f"f{i}"] for i in range(len(reqs))] == want
    assert engine.stats().spec_num_draft_tokens == drafted  # nothing drafted after the fault


def test_unloaded_draft_model_leaves_requests_unharmed():
    model = str(fixture_model("tiny-llama").hf_dir)
    reqs = looping_requests(4, seed=19)
    want = generate(cached_llm(model), reqs)
    spec = LLM(model, dtype="float32", speculative_method="draft", speculative_draft_model=model)
    engine = spec.engine
    for i, (ids, n) in enumerate(reqs):
        engine.add_request(f"u{i}", ids, SamplingParams(max_tokens=n, **GREEDY))
    engine.step()
    engine.step()
    engine.core.core.speculator.proposer.unload()
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out.outputs[0].token_ids
    assert [finals[f"u{i}"] for i in range(len(reqs))] == want


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["ngram", "suffix", "draft"])
def test_cuda_greedy_is_token_identical_with_overlap_and_graphs(method):
    """On CUDA: overlapped steps, and decode graphs for every step, those with drafts too (a
    row's 1 + k tokens replay as decode rows; the draft model replays its own graphs)."""
    model = str(fixture_model("tiny-llama").hf_dir)
    reqs = looping_requests(12, seed=23)
    plain = LLM(model, dtype="float32", device="cuda", engine_process=False)
    want = generate(plain, reqs)
    extra = {"speculative_draft_model": model} if method == "draft" else {}
    spec = LLM(model, dtype="float32", device="cuda", engine_process=False, speculative_method=method,
               speculative_max_batch=16, **extra)
    assert generate(spec, reqs) == want
    assert spec.engine.stats().spec_num_accepted_tokens > 0


def test_constrained_rows_beside_speculating_ones():
    """A grammar request joins while rows speculate: the rows go on drafting beside it (its
    masks cover each sampled position: tests/engine/test_spec_structured.py), its JSON is valid and the
    same as without speculation, and every other row keeps the tokens it gets without
    speculation."""
    import json

    from mlxr.types import StructuredOutputsParams

    model = str(fixture_model("tiny-llama").hf_dir)
    reqs = looping_requests(6, seed=5)
    want = generate(cached_llm(model), reqs)
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
              "additionalProperties": False}  # short: a random model writes integers to max_tokens
    constrained = SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=StructuredOutputsParams(json=schema))
    plain_json = cached_llm(model).generate([[5, 6, 7]], constrained)[0].outputs[0].token_ids
    spec = LLM(model, dtype="float32", speculative_method="ngram", num_speculative_tokens=4, max_num_seqs=16,
               speculative_max_batch=16)
    engine, finals = spec.engine, {}
    for i, (ids, n) in enumerate(reqs):
        engine.add_request(f"r{i}", ids, SamplingParams(max_tokens=n, **GREEDY))
    while engine.stats().spec_num_drafts == 0:  # until the others are drafting
        finals.update((o.request_id, o) for o in engine.step() if o.finished)
    engine.add_request("json", [5, 6, 7], constrained)
    while engine.has_unfinished():
        finals.update((o.request_id, o) for o in engine.step() if o.finished)
    assert [finals[f"r{i}"].outputs[0].token_ids for i in range(len(reqs))] == want
    out = finals["json"].outputs[0]
    assert out.finish_reason == "stop", finals["json"].error
    assert set(json.loads(out.text)) == {"a"} and out.token_ids == plain_json
    before = spec.engine.stats().spec_num_drafts
    assert generate(spec, reqs) == want
    assert spec.engine.stats().spec_num_drafts > before


def test_a_draft_model_samples_from_the_requests_filtered_distribution():
    """A sampled draft comes from the request's own distribution (here top_k = 3): q has mass
    only where the target's p can have it, so no draft is a token p never takes."""
    from types import SimpleNamespace

    from mlxr.engine.spec_decode.draft_model import DraftModelProposer

    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    top3 = set(logits.topk(3).indices.tolist())
    request = DraftRequest("r", [1, 2], 4, SamplingParams(temperature=0.7, top_k=3))
    proposer = SimpleNamespace(seqs={"r": SimpleNamespace(generator=torch.Generator().manual_seed(1))})
    for _ in range(20):
        token, q = DraftModelProposer._draw(proposer, logits, int(logits.argmax()), request)
        assert token in top3 and set(q.nonzero().flatten().tolist()) == top3
        assert abs(float(q.sum()) - 1.0) < 1e-5
