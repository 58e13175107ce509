"""Speculation under batch: the draft budget drafts where expected tokens per millisecond beat a
plain step (high acceptance, a step that costs little more with drafts) and drafts nothing where
they do not (low acceptance, a compute-bound batch); it plans from each request's measured
acceptance and probes again after a long run of empty plans."""
from __future__ import annotations

import json

import pytest

from mlxr.engine.spec_decode.batch_policy import PROBE_EVERY, DraftBudget, StepCosts, load_costs
from mlxr.errors import InvalidParameterError

BATCHES = (1, 16, 64)
DRAFTS = (1, 4)
# Bandwidth-bound at 1 and 16 (a draft costs a few percent), compute-bound at 64 (each draft
# row costs about as much as a row): a made-up device with the shape of a real one.
PLAIN = (2.0, 2.4, 6.0)
DRAFTING = ((2.4, 2.6), (2.9, 3.6), (13.0, 30.0))


def budget() -> DraftBudget:
    return DraftBudget(StepCosts(BATCHES, DRAFTS, PLAIN, DRAFTING))


@pytest.mark.parametrize("batch", [1, 16])
def test_high_acceptance_drafts_low_acceptance_does_not(batch):
    b = budget()
    high = b.best_counts(batch, [(0.9, 4)] * batch)
    assert sum(high) > 0 and max(high) <= 4
    assert b.best_counts(batch, [(0.1, 4)] * batch) == [0] * batch


def test_a_compute_bound_batch_drafts_nothing_even_at_high_acceptance():
    assert budget().best_counts(64, [(0.9, 4)] * 64) == [0] * 64


def test_drafts_go_to_the_rows_that_keep_them():
    counts = budget().best_counts(16, [(0.95, 4)] * 4 + [(0.05, 4)] * 12)
    assert all(c > 0 for c in counts[:4]) and counts[4:] == [0] * 12


def test_the_limit_bounds_the_drafts_in_all():
    assert sum(budget().best_counts(1, [(0.99, 4)], limit=2)) <= 2


def test_plans_follow_each_requests_measured_acceptance():
    b = budget()
    for _ in range(20):
        b.observe("good", 4, 4)  # every draft kept
        b.observe("bad", 4, 0)  # the first rejected
    assert b.acceptance("good") > 0.9 and b.acceptance("bad") < 0.2
    good, bad = b.plan(16, [("good", 4), ("bad", 4)] + [(f"x{i}", 0) for i in range(14)])[:2]
    assert good > 0 and bad == 0
    b.retain({"good"})
    assert "bad" not in b.kept and "bad" not in b.missed


def test_a_long_run_of_empty_plans_ends_in_a_probe():
    b = budget()
    for _ in range(20):
        b.observe("r", 4, 0)
    plans = [b.plan(1, [("r", 4)]) for _ in range(PROBE_EVERY)]
    assert plans == [[0]] * PROBE_EVERY
    assert b.plan(1, [("r", 4)], count=False) != [0]  # a look ahead sees the probe and leaves it for the step
    assert b.plan(1, [("r", 4)]) != [0]
    assert b.plan(1, [("r", 4)]) == [0]


def test_interpolation_and_table_loading(tmp_path):
    costs = StepCosts(BATCHES, DRAFTS, PLAIN, DRAFTING)
    assert costs.plain(8) == pytest.approx(2.0 + 0.4 * 7 / 15)
    assert costs.drafting(16, 16 * 4) == pytest.approx(3.6)
    assert costs.drafting(128, 128) > costs.drafting(64, 64)  # past the table: the last slope
    assert costs.drafting(64, 1) == pytest.approx(13.0 - 17.0 / 3 + 17.0 / 3 / 64)  # the landing's fixed cost stays
    assert costs.drafting(1, 0) == pytest.approx(2.4 - 0.2 / 3)
    entry = {"batches": BATCHES, "drafts": DRAFTS, "plain_ms": PLAIN, "drafting_ms": DRAFTING}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"devices": {"cpu": entry}}))
    assert load_costs(path, "cpu") == costs and load_costs(path, "NVIDIA H200") is None
    path.write_text(json.dumps({"devices": {"cpu": {**entry, "plain_ms": [1.0]}}}))
    with pytest.raises(InvalidParameterError, match="cost table"):
        load_costs(path, "cpu")
    path.write_text("{")
    with pytest.raises(InvalidParameterError, match="cannot be read"):
        load_costs(path, "cpu")
