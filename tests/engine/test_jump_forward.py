"""Jump-forward: with no speculative method configured, a structured-output row drafts the
tokens its grammar forces next (a schema's keys and punctuation) and the step verifies them like
any draft, so the output is the one the engine gives without them, in fewer steps."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from model_fixtures import cached_llm, fixture_model

from mlxr import LLM, SamplingParams
from mlxr.config import EngineConfig
from mlxr.engine.records import EngineCoreRequest, SchedulerOutput
from mlxr.engine.sched.request import Request
from mlxr.engine.spec_decode.speculator import Speculator
from mlxr.types import StructuredOutputsParams as SO

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["temperature_celsius", "items"],
          "properties": {"temperature_celsius": {"type": "integer", "minimum": -50, "maximum": 50},
                         "items": {"type": "array", "minItems": 2, "maxItems": 3, "items": {
                             "type": "object", "additionalProperties": False, "required": ["label", "ok"],
                             "properties": {"label": {"enum": ["first", "second"]}, "ok": {"type": "boolean"}}}}}}


def model_dir() -> str:
    return str(fixture_model("tiny-llama").hf_dir)


def _run(llm: LLM, batch: int, temperature: float = 0.0):
    params = [SamplingParams(max_tokens=120, temperature=temperature, seed=i, structured_outputs=SO(json=SCHEMA))
              for i in range(batch)]
    return llm.generate([[11 + i, 230, 41, 99, 5] for i in range(batch)], params)


@pytest.mark.parametrize("batch", [1, 4])
def test_forced_tokens_are_drafted_and_the_greedy_output_is_unchanged(batch, monkeypatch):
    monkeypatch.delenv("MLXR_JUMP_FORWARD", raising=False)
    plain = cached_llm(model_dir(), jump_forward=False)
    want = [o.outputs[0].token_ids for o in _run(plain, batch)]
    llm = LLM(model_dir(), dtype=torch.float32)  # jump-forward is on by default
    outs = _run(llm, batch)
    assert [o.outputs[0].token_ids for o in outs] == want
    for o in outs:
        jsonschema.validate(json.loads(o.outputs[0].text), SCHEMA)
    stats = llm.engine.stats()
    # the keys' tokens ("temperature_celsius", "items", "label", "ok" and their quotes) were drafted
    assert stats.spec_num_drafts >= batch * 4 and stats.spec_num_accepted_tokens >= batch * 10
    # no proposer: every draft was a grammar's forced tokens, and counted as jump-forward's
    assert (stats.jump_forward_drafts, stats.jump_forward_draft_tokens, stats.jump_forward_accepted_tokens) == (
        stats.spec_num_drafts, stats.spec_num_draft_tokens, stats.spec_num_accepted_tokens)


def test_sampled_rows_with_forced_drafts_stay_valid_and_follow_their_seeds():
    llm = cached_llm(model_dir(), jump_forward=True)
    first = [o.outputs[0].text for o in _run(llm, 3, temperature=1.0)]
    for text in first:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert llm.engine.stats().spec_num_drafts > 0  # the rejection sampler verified forced drafts
    assert [o.outputs[0].text for o in _run(llm, 3, temperature=1.0)] == first  # the same seeds, the same text


def test_unconstrained_requests_never_draft():
    llm = LLM(model_dir(), dtype=torch.float32, jump_forward=True)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in cached_llm(model_dir(), jump_forward=False).generate(["a b c"] * 2, params)]
    assert [o.outputs[0].token_ids for o in llm.generate(["a b c"] * 2, params)] == want
    assert llm.engine.stats().spec_num_drafts == llm.engine.stats().jump_forward_drafts == 0


def test_off_leaves_no_speculator_and_the_environment_turns_it_off(monkeypatch):
    llm = cached_llm(model_dir(), jump_forward=False)
    assert llm.engine.core.core.speculator is None
    monkeypatch.setenv("MLXR_JUMP_FORWARD", "0")
    assert EngineConfig().jump_forward is False
    monkeypatch.setenv("MLXR_JUMP_FORWARD", "1")
    assert EngineConfig().jump_forward is True


def test_the_cli_flag_sets_the_config(monkeypatch):
    from mlxr.cli.main import build_parser
    from mlxr.cli.serve import server_config

    monkeypatch.delenv("MLXR_JUMP_FORWARD", raising=False)
    parser, _ = build_parser()
    ns = parser.parse_args(["serve", "--no-jump-forward"])
    assert server_config(ns, (), ()).engine.jump_forward is False
    ns = parser.parse_args(["serve"])
    assert server_config(ns, (), ()).engine.jump_forward is True


class _Grammar:
    """A grammar that always forces the same tokens next."""

    done = False

    def __init__(self, forced: list[int]) -> None:
        self.forced = forced

    def forced_tokens(self) -> list[int]:
        return list(self.forced)


def _request(rid: str, grammar) -> Request:
    req = Request(EngineCoreRequest(rid, [5, 6, 7], SamplingParams(max_tokens=32, temperature=0.0), 32, [], 0.0))
    req.num_computed_tokens, req.grammar = 2, grammar
    return req


def test_forced_drafts_keep_to_the_step_rows_and_the_batch_bound():
    rows = [_request(f"r{i}", _Grammar([40, 41, 42, 43])) for i in range(4)] + [_request("free", None)]
    spec = Speculator(None, max_drafts=4, max_batch=8, jump_forward=True, max_rows=11)
    spec.propose(rows)
    # 5 rows leave 6 draft rows: the first row takes 4, the second 2, the rest none
    assert [r.spec_token_ids for r in rows] == [[40, 41, 42, 43], [40, 41], [], [], []]
    assert spec.needs_landed_tokens(rows, _inflight())
    for r in rows:
        r.spec_token_ids = []  # (the scheduler took them)
    bounded = Speculator(None, max_drafts=4, max_batch=4, jump_forward=True)
    bounded.propose(rows)  # 5 running: past the bound, nothing is drafted
    assert all(r.spec_token_ids == [] for r in rows) and not bounded.needs_landed_tokens(rows, _inflight())
    bounded.propose(rows[:4])
    assert all(r.spec_token_ids == [40, 41, 42, 43] for r in rows[:4])
    for r in rows:
        r.spec_token_ids = []
    off = Speculator(None, max_drafts=4, max_batch=8, jump_forward=False)
    off.propose(rows)
    assert all(r.spec_token_ids == [] for r in rows) and not off.needs_landed_tokens(rows, _inflight())


def _inflight() -> SchedulerOutput:
    """A step in flight that carried no drafts."""
    return SchedulerOutput(request_ids=["r0"], num_scheduled_tokens=[1], num_computed_tokens=[2])


@pytest.mark.gpu
def test_cuda_rows_draft_forced_tokens_under_graphs():
    """On CUDA: graphs are captured for the drafting rows (1 + k a request, up to
    speculative_max_batch requests) past max_num_seqs, and the output is unchanged."""
    kwargs = {"dtype": "float32", "device": "cuda", "engine_process": False, "max_num_seqs": 8}
    plain = LLM(model_dir(), jump_forward=False, **kwargs)
    want = [o.outputs[0].token_ids for o in _run(plain, 6)]
    llm = LLM(model_dir(), **kwargs)
    assert llm.engine.core.core.runner.graphs.padded_size(8 * 5) is not None
    assert [o.outputs[0].token_ids for o in _run(llm, 6)] == want
    assert llm.engine.stats().spec_num_drafts >= 6 * 4


def test_graph_sizes_reach_past_a_bound_between_sizes():
    from mlxr.engine.worker.cuda_graphs import graph_sizes

    assert graph_sizes(40)[-2:] == [32, 40]  # 8 requests of 1 + 4 rows replay, not eagerly
    assert graph_sizes(64)[-2:] == [48, 64] and graph_sizes(1) == [1]
    assert graph_sizes(100)[-2:] == [96, 100]  # never past the bound (cuda_graph_max_batch)


def test_a_kept_forced_run_does_not_shorten_the_next_one():
    from mlxr.engine.records import ModelRunnerOutput

    grammar = _Grammar([40])  # a one-token forced run (a quote), then a longer one (a key)
    row = _request("r", grammar)
    spec = Speculator(None, max_drafts=4, max_batch=8, jump_forward=True)
    spec.propose([row])
    assert row.spec_token_ids == [40]
    spec.observe(SchedulerOutput(request_ids=["r"], num_scheduled_tokens=[2], num_computed_tokens=[2],
                                 spec_token_ids={"r": [40]}), ModelRunnerOutput(["r"], [[40, 7]], None))
    grammar.forced = [50, 51, 52, 53, 54]
    spec.propose([row])
    assert row.spec_token_ids == [50, 51, 52, 53]  # all k, not 2 (a proposer's kept short draft would give 2)


def test_no_landing_without_room_and_a_failed_proposer_keeps_forced_drafts():
    class Failing:
        def propose(self, requests):
            raise RuntimeError("draft model gone")

        def retain(self, request_ids):
            pass

    rows = [_request(f"r{i}", _Grammar([40, 41])) for i in range(3)]
    full = Speculator(None, max_drafts=4, max_batch=8, jump_forward=True, max_rows=3)
    assert not full.needs_landed_tokens(rows, _inflight())  # 3 rows fill the largest graph
    spec = Speculator(Failing(), max_drafts=4, max_batch=8, jump_forward=True)
    spec.propose(rows)  # the proposer fails: speculation off for these requests ...
    spec.propose(rows)  # ... but their grammars' forced tokens still draft
    assert all(r.spec_token_ids == [40, 41] for r in rows)


def test_drafts_left_from_a_small_batch_are_cleared_past_the_bound():
    rows = [_request(f"r{i}", _Grammar([40, 41])) for i in range(3)]
    spec = Speculator(None, max_drafts=4, max_batch=2, jump_forward=True)
    spec.propose(rows[:2])
    assert rows[0].spec_token_ids == [40, 41]
    spec.propose(rows)  # the batch grew past the bound before the scheduler took them
    assert all(r.spec_token_ids == [] for r in rows)
