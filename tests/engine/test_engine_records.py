"""Every engine-core record survives msgspec encoding (what crosses the process boundary) and
the runner runs a hand-built SchedulerOutput alone, with no scheduler."""
from __future__ import annotations

import pytest
import torch

from model_fixtures import fixture_model
from mlxr.engine.records import (
    EngineCoreOutput, EngineCoreRequest, ModelRunnerOutput, NewRequestData, SchedulerOutput, TokenLogprob,
    decoder, encode,
)
from mlxr.types import SamplingParams

PARAMS = SamplingParams(max_tokens=5, temperature=0.7, top_k=4, seed=11, stop=["\n\n"], stop_token_ids=[3],
                        logprobs=2, logit_bias={17: -2.5})

RECORDS = [
    EngineCoreRequest("r1", [1, 2, 3], PARAMS, 5, [2], 12.5),
    EngineCoreOutput("r1", [4, 5], [TokenLogprob(4, -0.1, 1, [(4, -0.1), (9, -2.0)]), TokenLogprob(5, -0.3, 2)],
                     "stop", 5, 16, 1.25, None),
    EngineCoreOutput("r2", finish_reason="error", error="RuntimeError: boom"),
    SchedulerOutput(
        request_ids=["r1", "r2"], num_scheduled_tokens=[3, 1], num_computed_tokens=[0, 7],
        new_requests=[NewRequestData("r1", [1, 2, 3], 3, PARAMS, [2], [4])],
        new_block_ids={"r2": [9]}, replaced_block_tables={"r3": [1, 2]}, finished_request_ids=["r0"],
        preempted_request_ids=["r4"], blocks_to_copy=[(1, 2)], blocks_to_swap_out=[(3, 0)],
        blocks_to_swap_in=[(0, 5)], spec_token_ids={"r2": [8, 9]}, grammar_bitmask=b"\xff\x00\x01\x02",
    ),
    ModelRunnerOutput(["r1", "r2"], [[4], [8, 9, 10]], [[TokenLogprob(4, -0.5, 1)], None]),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_round_trips(record):
    wire = encode(record)
    assert isinstance(wire, bytes)
    assert decoder(type(record)).decode(wire) == record


def test_a_decoded_request_keeps_its_sampling_params_checked():
    import msgspec

    from mlxr.errors import InvalidParameterError

    forged = msgspec.msgpack.encode(["r", [1], {"temperature": -1.0}, 5, [], 0.0])
    with pytest.raises((InvalidParameterError, msgspec.ValidationError)):
        decoder(EngineCoreRequest).decode(forged)


@pytest.fixture(scope="module")
def runner():
    from mlxr.engine.kv.cache import KVCache
    from mlxr.engine.worker.model_runner import ModelRunner
    from mlxr.loader import load_model

    loaded = load_model(str(fixture_model("tiny-llama").hf_dir), dtype=torch.float32)
    kv = KVCache(loaded.args, 16, 4, torch.float32, torch.device("cpu"), 0)
    return ModelRunner(loaded.model, kv, torch.device("cpu")), loaded


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0.0)


def test_the_runner_runs_a_hand_built_step_and_continues_from_counts(runner):
    """Prefill of two requests, then a decode step that names only counts and a new block: the
    runner's sampled ids equal the model's own greedy continuation (a full recompute)."""
    run, loaded = runner
    prompts = {"a": [5, 6, 7, 8, 9], "b": [10, 11]}
    first = SchedulerOutput(
        request_ids=["a", "b"], num_scheduled_tokens=[5, 2], num_computed_tokens=[0, 0],
        new_requests=[NewRequestData("a", prompts["a"], 5, greedy(4), [], [0, 1]),
                      NewRequestData("b", prompts["b"], 2, greedy(4), [], [2])],
    )
    got1 = run.execute(first).result()
    assert got1.request_ids == ["a", "b"] and all(len(t) == 1 for t in got1.sampled_token_ids)
    second = SchedulerOutput(request_ids=["a", "b"], num_scheduled_tokens=[1, 1], num_computed_tokens=[5, 2])
    got2 = run.execute(second).result()
    for rid, row in (("a", 0), ("b", 1)):
        want = reference_greedy(loaded, prompts[rid], 2)
        assert [got1.sampled_token_ids[row][0], got2.sampled_token_ids[row][0]] == want
    assert run.batch.states["a"].token_ids == prompts["a"] + [got1.sampled_token_ids[0][0], got2.sampled_token_ids[0][0]]
    forget = SchedulerOutput(request_ids=["b"], num_scheduled_tokens=[1], num_computed_tokens=[3],
                             finished_request_ids=["a"])
    run.execute(forget).result()
    assert set(run.batch.states) == {"b"}


def test_a_prompt_chunk_samples_nothing(runner):
    run, _ = runner
    out = SchedulerOutput(request_ids=["c"], num_scheduled_tokens=[3], num_computed_tokens=[0],
                          new_requests=[NewRequestData("c", [5, 6, 7, 8, 9, 10], 6, greedy(2), [], [3, 4])])
    assert run.execute(out).result().request_ids == []
    rest = SchedulerOutput(request_ids=["c"], num_scheduled_tokens=[3], num_computed_tokens=[3],
                           finished_request_ids=["b"])
    assert run.execute(rest).result().request_ids == ["c"]


def reference_greedy(loaded, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens by recomputing the whole sequence each time in fresh blocks."""
    from mlxr.engine.kv.cache import KVCache
    from mlxr.engine.worker.model_runner import ModelRunner

    ids = list(prompt)
    for _ in range(n):
        kv = KVCache(loaded.args, 8, 4, torch.float32, torch.device("cpu"), 0)
        hidden = ModelRunner(loaded.model, kv, torch.device("cpu")).hidden_states(ids, list(range(-(-len(ids) // 4))))
        with torch.inference_mode():
            ids.append(int(loaded.model.compute_logits(hidden[-1:]).argmax()))
    return ids[len(prompt):]


def test_a_speculative_row_split_into_decode_rows_gives_the_same_logits(runner):
    """On CUDA a speculative row's 1 + k tokens run as decode rows (so a decode graph replays
    them): each row's logits equal those of the row run as one causal chunk, beside a plain
    decode row in the same step."""
    run, _ = runner
    first = SchedulerOutput(
        request_ids=["s", "p"], num_scheduled_tokens=[6, 3], num_computed_tokens=[0, 0],
        new_requests=[NewRequestData("s", [3, 1, 4, 1, 5, 9], 6, greedy(8), [], [5, 6]),
                      NewRequestData("p", [2, 7, 1], 3, greedy(8), [], [8])],
    )
    run.execute(first).result()
    spec = SchedulerOutput(request_ids=["s", "p"], num_scheduled_tokens=[4, 1], num_computed_tokens=[6, 3],
                           new_block_ids={"s": [7]}, spec_token_ids={"s": [2, 6, 5]})
    run.batch.update(spec)
    chunk = run.batch._build(spec, None, split_drafts=False)
    split = run.batch._build(spec, None, split_drafts=True)
    assert chunk.meta.query_lens_list == [4, 1] and split.meta.query_lens_list == [1] * 5
    assert split.meta.seq_lens_list == [7, 8, 9, 10, 4] and split.logit_rows == chunk.logit_rows == [0, 1, 2, 3, 4]
    with torch.inference_mode():
        ids_chunk, logits_chunk = run._run_inputs(chunk)
        ids_split, logits_split = run._run_inputs(split)
    assert ids_chunk == ids_split == ["s", "p"]
    torch.testing.assert_close(logits_split, logits_chunk, rtol=1e-5, atol=1e-5)
    run.batch.update(SchedulerOutput(request_ids=[], num_scheduled_tokens=[], num_computed_tokens=[],
                                     finished_request_ids=["s", "p"]))
