"""The engine core's one owner of its steps in flight (core/in_flight.py): what it holds after a
step, and that landing empties it, under overlap forced on the CPU."""
from __future__ import annotations

import time

import pytest

from model_fixtures import fixture_model
from mlxr import LLM, SamplingParams
from mlxr.engine.records import EngineCoreRequest
from mlxr.types import StructuredOutputsParams as SO


@pytest.fixture(scope="module")
def core():
    return LLM(str(fixture_model("tiny-llama").hf_dir), dtype="float32", overlap_steps=True).engine.core.core


def _add(core, rid: str, params: SamplingParams) -> None:
    core.add_request(EngineCoreRequest(rid, [5, 6, 7], params, params.max_tokens, [], time.monotonic()))


def _run_to_end(core) -> list:
    outputs = []
    while core.has_unfinished():
        outputs += core.step()
    return outputs


def test_a_launched_step_stays_in_flight_until_landed(core):
    _add(core, "plain", SamplingParams(max_tokens=4, temperature=0.0))
    assert core.in_flight.empty
    assert core.step() == []  # under overlap the step lands in the next call
    flight = core.in_flight
    assert not flight.empty and flight.launched.request_ids == ["plain"] and not flight.forwarded
    landed = flight.land()
    assert [(o.request_id, len(o.new_token_ids)) for o in landed] == [("plain", 1)]
    assert flight.empty and flight.launched is None and flight.land() == []
    assert sum(len(o.new_token_ids) for o in _run_to_end(core)) == 3
    assert core.block_manager.usage().used == 0


def test_a_constrained_step_is_forwarded_then_sampled(core):
    _add(core, "constrained", SamplingParams(max_tokens=6, temperature=0.0, structured_outputs=SO(regex=r"[0-9]{6}")))
    outputs = []
    while not core.in_flight.forwarded:  # its grammar compiles first, then its first step goes ahead
        assert core.has_unfinished()
        outputs += core.step()
    flight = core.in_flight
    assert flight.launched is None  # the forward went ahead of the sampling: nothing sampled yet
    assert flight.sample_forwarded() == []
    assert not flight.forwarded and flight.launched.request_ids == ["constrained"]
    assert flight.sample_forwarded() == []  # none waits now
    outputs += flight.land()
    assert [o.request_id for o in outputs] == ["constrained"] and not outputs[0].finish_reason
    outputs += _run_to_end(core)
    assert outputs[-1].finish_reason in ("stop", "length")  # the regex's end, or 6 tokens
    assert core.in_flight.empty and core.block_manager.usage().used == 0
