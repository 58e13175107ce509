"""T5: a request's grammar checks run in worker processes under one time budget; a check still
running when the budget is spent is stopped (its process killed), never left to run on."""
from __future__ import annotations

import asyncio
import time

import pytest
from slow_grammars import slow_union_schema

from mlxr.engine.structured import check_process
from mlxr.engine.structured.check_process import CheckBudget, GrammarBudgetError, GrammarChecks, check_bounded
from mlxr.errors import InvalidParameterError
from mlxr.types import StructuredOutputsParams


def slow_union(tools: int) -> StructuredOutputsParams:
    return StructuredOutputsParams(json=slow_union_schema(tools))


@pytest.fixture(scope="module")
def checks():
    pool = GrammarChecks(processes=1)
    yield pool
    worker = pool._slots.get_nowait()
    if worker is not None:
        worker.stop()


def test_a_check_past_its_budget_is_refused_and_its_process_stopped(checks):
    checks.check(StructuredOutputsParams(regex="[a-z]+"), CheckBudget(60))  # the process is up
    worker = checks._slots.queue[-1]
    start = time.monotonic()
    with pytest.raises(GrammarBudgetError, match="did not finish within 1 s"):
        checks.check(slow_union(4), CheckBudget(1.0))
    assert time.monotonic() - start < 1.5
    assert worker.proc.poll() is not None  # stopped, not left running
    assert checks.check(StructuredOutputsParams(regex="[0-9]+"), CheckBudget(60))  # a new process answers


def test_the_worker_names_the_problem_and_a_passing_spec_is_remembered(checks):
    with pytest.raises(InvalidParameterError, match="matches nothing"):
        checks.check(StructuredOutputsParams(regex=r"[^\s\S]"), CheckBudget(60))
    spec = StructuredOutputsParams(json={"type": "object", "properties": {"t5": {"type": "integer"}}})
    assert "t5" in checks.check(spec, CheckBudget(60))
    assert check_process.checked_before(spec)


def test_a_request_shares_one_budget_across_its_checks(monkeypatch):
    monkeypatch.setenv("MLXR_GRAMMAR_CHECK_BUDGET_S", "1.5")

    async def two_slow_checks() -> float:
        start = time.monotonic()
        with pytest.raises(GrammarBudgetError):
            await check_bounded(slow_union(2))
        with pytest.raises(GrammarBudgetError):  # what the first left, not 1.5 s more
            await check_bounded(slow_union(3))
        return time.monotonic() - start

    assert asyncio.run(two_slow_checks()) < 2.5


def test_waiting_for_a_busy_process_counts_against_the_budget():
    pool = GrammarChecks(processes=1)
    worker = pool._slots.get()  # every process taken
    start = time.monotonic()
    with pytest.raises(GrammarBudgetError):
        pool.check(StructuredOutputsParams(regex="x+y"), CheckBudget(0.5))
    assert time.monotonic() - start < 1.0
    pool._slots.put(worker)


def test_the_engine_core_compiles_an_admitted_grammar_without_checking_it_again():
    # A core process never saw the admission's check: before, it ran the whole check again on
    # its compile thread, the GIL held for seconds (every stream's step waiting).
    from model_fixtures import fixture_model

    from mlxr.engine.structured.compiler import GrammarCompiler
    from mlxr.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.from_hf_dir(fixture_model("tiny-llama").hf_dir)
    compiler = GrammarCompiler(tok, tok.vocab_size)
    compiler.ll_tokenizer()
    spec = StructuredOutputsParams(json=slow_union_schema(2, n=8500))  # its check: ~4 s
    assert not check_process.checked_before(spec)
    start = time.monotonic()
    compiler.compile(spec)
    assert time.monotonic() - start < 1.0
    compiler.shutdown()
