"""Speculation under batch in the engine: with a step-cost table for the device, the drafts per
row come from it and the measured acceptance at any batch (past speculative_max_batch where
drafting is cheap, never where it costs more than it can earn), and greedy output stays the
plain engine's either way."""
from __future__ import annotations

import json

import pytest

from model_fixtures import cached_llm, fixture_model
from test_spec_decode import generate, looping_requests
from mlxr import LLM

BATCHES, DRAFTS, PLAIN = [1, 4, 16], [1, 4], [10.0, 11.0, 12.0]


def table(tmp_path, factor: float) -> str:
    """A "cpu" entry whose drafting steps cost factor x a plain step (at any draft count)."""
    entry = {"batches": BATCHES, "drafts": DRAFTS, "plain_ms": PLAIN,
             "drafting_ms": [[p * factor, p * factor * 1.001] for p in PLAIN]}
    path = tmp_path / f"costs-{factor}.json"
    path.write_text(json.dumps({"devices": {"cpu": entry}}))
    return str(path)


@pytest.mark.parametrize("method", ["suffix", "ngram"])
def test_cheap_drafts_pass_the_cut_off_and_dear_ones_never_run(tmp_path, method):
    model = str(fixture_model("tiny-llama").hf_dir)
    reqs = looping_requests(12, seed=29)
    want = generate(cached_llm(model), reqs)
    drafts = {}
    # "dear" runs under a cut-off that drafts at every batch here (test_spec_suffix.py's batched
    # tests draft under it): only the table holds it back.
    cases = (("cut-off", "none", 1), ("cheap", table(tmp_path, 1.05), 1), ("dear", table(tmp_path, 3.0), 16))
    for name, cost_table, max_batch in cases:
        llm = LLM(model, dtype="float32", speculative_method=method, num_speculative_tokens=4, max_num_seqs=16,
                  speculative_max_batch=max_batch, speculative_cost_table=cost_table)
        assert generate(llm, reqs) == want, name
        drafts[name] = llm.engine.stats().spec_num_drafts
        llm.shutdown()
    assert drafts["cheap"] > max(20, 3 * drafts["cut-off"]), drafts  # past one running request only the table drafts
    assert drafts["dear"] == 0  # three times a plain step: no draft can earn it


def test_a_table_without_this_device_keeps_the_cut_off(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"devices": {"NVIDIA H200": {}}}))
    model = str(fixture_model("tiny-llama").hf_dir)
    llm = LLM(model, dtype="float32", speculative_method="suffix", speculative_cost_table=str(path))
    assert llm.engine.core.core.speculator.budget is None
