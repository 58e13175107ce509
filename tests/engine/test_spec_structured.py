"""Speculative decoding with structured output: a constrained row drafts too, each sampled
position under the grammar's mask after the drafts before it (StructuredOutputManager.
position_bitmask), so a draft the grammar refuses is rejected and the output is the one the
plain constrained engine gives."""
from __future__ import annotations

import re

import llguidance.torch as llg_torch
import pytest
import torch
from model_fixtures import cached_llm, fixture_model

from mlxr import LLM, SamplingParams
from mlxr.engine.structured.compiler import GrammarCompiler
from mlxr.engine.structured.manager import StructuredOutputManager
from mlxr.tokenizer.tokenizer import Tokenizer
from mlxr.types import StructuredOutputsParams as SO

PATTERN = "(abc (def|ghi) ){5}xyz"  # "abc " forced, then a choice the lookup drafts
PROMPT = "abc def qqq abc def qqq abc"  # lookups propose "qqq" after "abc def", which the grammar refuses


def model_dir() -> str:
    return str(fixture_model("tiny-llama").hf_dir)


def spec_llm() -> LLM:
    return LLM(model_dir(), dtype="float32", speculative_method="ngram", num_speculative_tokens=4)


def plain_llm() -> LLM:
    """The constrained engine without drafts of any kind (no proposer, no jump-forward)."""
    return cached_llm(model_dir(), jump_forward=False)


def test_a_constrained_row_drafts_and_matches_the_plain_constrained_engine():
    params = SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=SO(regex=PATTERN))
    plain = plain_llm().generate([PROMPT], params)[0].outputs[0]
    llm = spec_llm()
    out = llm.generate([PROMPT], params)[0].outputs[0]
    assert re.fullmatch(PATTERN, out.text) and out.finish_reason == "stop"
    assert out.token_ids == plain.token_ids
    stats = llm.engine.stats()
    assert stats.spec_num_drafts > 0 and stats.spec_num_accepted_tokens > 0
    assert stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens  # some drafts were refused


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_constrained_rows_with_drafts_stay_in_the_grammar(seed):
    pattern = "(abc def |abc qqq ){6}(xyz|uvw)"
    params = SamplingParams(max_tokens=60, temperature=1.0, seed=seed, structured_outputs=SO(regex=pattern))
    llm = spec_llm()
    outs = llm.generate([PROMPT] * 3, params)
    for o in outs:
        assert re.fullmatch(pattern, o.outputs[0].text), o.outputs[0].text
    assert llm.engine.stats().spec_num_drafts > 0


def test_a_batch_mixes_constrained_and_free_rows_with_drafts():
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    constrained = SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=SO(regex=PATTERN))
    prompts, params = [PROMPT, PROMPT + " def", PROMPT], [constrained, free, constrained]
    want = [o.outputs[0].token_ids for o in plain_llm().generate(prompts, params)]
    llm = spec_llm()
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == want
    assert llm.engine.stats().spec_num_drafts > 0


@pytest.fixture(scope="module")
def manager():
    tok = Tokenizer.from_hf_dir(fixture_model("tiny-llama").hf_dir)
    m = StructuredOutputManager(tok, tok.vocab_size)
    m.add(_Req("warm", None))  # builds the compiler, filler and buffers
    return m, tok, GrammarCompiler(tok, tok.vocab_size)


class _Req:
    def __init__(self, request_id, grammar, structured=SO(regex=PATTERN)):
        self.request_id, self.grammar = request_id, grammar
        self.params = SamplingParams(structured_outputs=structured)


def test_position_bitmask_rows_follow_the_drafts(manager):
    m, tok, compiler = manager
    words = (compiler.vocab_size + 31) // 32
    good = tok.encode("abc def abc", add_special_tokens=False)
    refused = tok.encode("abc qqq", add_special_tokens=False)
    g1, g2 = compiler.compile(SO(regex=PATTERN)), compiler.compile(SO(regex=PATTERN))
    rows = [_Req("a", g1), None, _Req("b", g2)]
    drafts = [good, [7, 8], refused]
    mask = m.position_bitmask(rows, drafts).clone()
    assert mask.shape == (3 + len(good) + 2 + len(refused), words)
    expect = torch.zeros(len(good) + 1, words, dtype=torch.int32)
    for j in range(len(good) + 1):  # the matcher's own masks after each draft
        llg_torch.fill_next_token_bitmask(g1.matcher, expect, j)
        if j < len(good):
            assert g1.matcher.consume_token(good[j])
    g1.matcher.rollback(len(good))
    assert torch.equal(mask[: len(good) + 1], expect)
    free = mask[len(good) + 1: len(good) + 4]
    assert bool((free == -1).all())  # the unconstrained row: every token
    first_refused = 1 + next(j for j, t in enumerate(refused) if not _allows(mask[len(good) + 4 + j], t))
    assert bool((mask[len(good) + 4 + first_refused:] == -1).all())  # past the refused draft: unused
    assert g1.num_tokens == 0 and not g1.matcher.is_error() and not g2.matcher.is_error()
    assert m.position_bitmask([None, _Req("c", None)], [[1], []]) is None


def _allows(row: torch.Tensor, token: int) -> bool:
    return bool((int(row[token // 32]) >> (token % 32)) & 1)


@pytest.mark.gpu
def test_cuda_constrained_rows_draft_under_position_masks():
    """On CUDA (graphs, pinned mask buffers): the same identity as on the CPU."""
    params = SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=SO(regex=PATTERN))
    prompts = [PROMPT, PROMPT + " def"]
    plain = LLM(model_dir(), dtype="float32", device="cuda", engine_process=False, jump_forward=False)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    spec = LLM(model_dir(), dtype="float32", device="cuda", engine_process=False, speculative_method="ngram",
               num_speculative_tokens=4)
    assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == want
    assert spec.engine.stats().spec_num_drafts > 0


def test_a_grammars_forced_tokens_are_drafted():
    """A schema's keys are text the grammar forces: a constrained row drafts them with no n-gram
    match to find (a random prompt), and its output is the plain constrained engine's."""
    schema = {"type": "object", "properties": {"temperature_celsius": {"type": "integer"},
                                               "relative_humidity_percent": {"type": "boolean"}},
              "required": ["temperature_celsius", "relative_humidity_percent"], "additionalProperties": False}
    params = SamplingParams(max_tokens=60, temperature=0.0, structured_outputs=SO(json=schema))
    prompt = [17, 230, 41, 99, 5]
    plain = plain_llm().generate([prompt], params)[0].outputs[0]
    llm = spec_llm()
    out = llm.generate([prompt], params)[0].outputs[0]
    assert out.token_ids == plain.token_ids and out.finish_reason == plain.finish_reason
    stats = llm.engine.stats()
    assert stats.spec_num_drafts > 0 and stats.spec_num_accepted_tokens >= 8  # the keys' tokens
    # the keys came as jump-forward's drafts, a part of all drafts (the n-gram proposer drafts too)
    assert 0 < stats.jump_forward_draft_tokens <= stats.spec_num_draft_tokens
    assert 0 < stats.jump_forward_accepted_tokens <= stats.spec_num_accepted_tokens


def test_forced_tokens_of_a_grammar_state(manager):
    _, tok, compiler = manager
    g = compiler.compile(SO(json={"type": "object", "properties": {"alpha_beta": {"type": "integer"}},
                                  "required": ["alpha_beta"], "additionalProperties": False}))
    assert tok.decode(g.forced_tokens()) == '{"alpha_beta":'
    assert g.matcher.consume_token(g.forced_tokens()[0]) and g.forced_tokens()  # still forced after a token


def test_the_speculator_drafts_forced_tokens_where_they_outrun_its_proposer(manager):
    from mlxr.engine.records import EngineCoreRequest
    from mlxr.engine.sched.request import Request
    from mlxr.engine.spec_decode.proposer import Draft
    from mlxr.engine.spec_decode.speculator import Speculator

    _, _, compiler = manager
    lengths = {"c": 0, "f": 0}

    class Recording:
        def propose(self, requests):
            return [Draft(list(range(100, 100 + lengths[r.request_id]))) for r in requests]

        def retain(self, request_ids):
            pass

    def request(rid: str, grammar) -> Request:
        req = Request(EngineCoreRequest(rid, [5, 6, 7], SamplingParams(max_tokens=32, temperature=0.0), 32, [], 0.0))
        req.num_computed_tokens, req.grammar = 2, grammar
        return req

    g = compiler.compile(SO(json={"type": "object", "properties": {"alpha_beta": {"type": "integer"}},
                                  "required": ["alpha_beta"], "additionalProperties": False}))
    forced = g.forced_tokens()
    assert len(forced) > 2
    constrained, free = request("c", g), request("f", None)
    spec = Speculator(Recording(), max_drafts=8, max_batch=8, jump_forward=True)
    spec.propose([constrained, free])
    assert constrained.spec_token_ids == forced[:8] and free.spec_token_ids == []
    lengths["c"] = 8  # a proposer's draft as long as the forced text or longer is kept
    spec.propose([constrained, free])
    assert constrained.spec_token_ids == list(range(100, 108))
