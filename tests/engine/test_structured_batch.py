"""Structured output at batch sizes whose masks may fill on the manager's worker thread and whose
matchers take landed tokens in one batch (llguidance's executor or this thread): the masks are
llguidance's own row by row, the persistent buffers are reused without stale rows, every
constrained output validates, and overlapped steps give the same tokens as steps one at a time."""
from __future__ import annotations

import json

import jsonschema
import llguidance.torch as llg_torch
import pytest
import torch

from model_fixtures import fixture_model
from structured_schemas import SCHEMAS
from mlxr import LLM, SamplingParams
from mlxr.engine.structured.chooser import PARALLEL_ROWS, TRIALS
from mlxr.engine.structured.compiler import GrammarCompiler
from mlxr.engine.structured.manager import StructuredOutputManager
from mlxr.engine.structured.matcher import MAX_THREADS, THREADS_ENV, advance_all, threads_from_env
from mlxr.tokenizer.tokenizer import Tokenizer
from mlxr.types import StructuredOutputsParams as SO

ROWS = PARALLEL_ROWS + 4
NAMES = ["nested_mixed", "record_like", "array_of_objects", "many_fields", "enum_strings"]


class Row:  # what the manager reads of a scheduled request
    def __init__(self, grammar) -> None:
        self.grammar = grammar


@pytest.fixture(scope="module")
def model_dir():
    return str(fixture_model("tiny-llama").hf_dir)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer.from_hf_dir(model_dir)


def reference(matcher, words: int) -> torch.Tensor:
    mask = torch.zeros((1, words), dtype=torch.int32)
    llg_torch.fill_next_token_bitmask(matcher, mask, 0)
    return mask[0]


def allowed(mask_row: torch.Tensor, vocab: int) -> list[int]:
    return [t for t in range(vocab) if (int(mask_row[t // 32]) >> (t % 32)) & 1]


def test_worker_fill_is_llguidance_row_by_row_in_reused_buffers(tokenizer):
    manager = StructuredOutputManager(tokenizer, tokenizer.vocab_size)
    manager.add(_request(SO(json=SCHEMAS["record_like"])))  # builds the compiler, filler and buffers
    comp = GrammarCompiler(tokenizer, tokenizer.vocab_size)
    words = (comp.vocab_size + 31) // 32
    states = [comp.compile(SO(json=SCHEMAS[NAMES[i % len(NAMES)]])) for i in range(ROWS)]
    seen = set()
    for step in range(6):
        # Unconstrained rows move about, so a reused buffer's stale row must be reset.
        free = {step % ROWS, (3 * step + 1) % ROWS}
        rows = [None if i in free else Row(s) for i, s in enumerate(states)]
        pending = manager.bitmask(rows)
        # The first large batches try both places: the worker (pending) and the step thread.
        mask = pending if isinstance(pending, torch.Tensor) else pending()
        seen.add(mask.data_ptr())
        for i, s in enumerate(states):
            expect = torch.full((words,), -1, dtype=torch.int32) if i in free else reference(s.matcher, words)
            assert torch.equal(mask[i], expect), (step, i)
        for i, s in enumerate(states):
            if i not in free and not s.done:
                choice = allowed(mask[i], comp.vocab_size)
                assert s.advance(choice[(5 * i + step) % len(choice)]) != "error"
    assert len(seen) == 2  # two persistent buffers, in turn
    assert manager.timing.waited > 0 and manager.timing.on_step_thread > 0
    manager.shutdown()
    comp.shutdown()


def test_batched_advance_matches_one_at_a_time(tokenizer):
    comp = GrammarCompiler(tokenizer, tokenizer.vocab_size)
    words = (comp.vocab_size + 31) // 32
    batched, single = ([comp.compile(SO(json=SCHEMAS[NAMES[i % len(NAMES)]])) for i in range(ROWS)]
                       for _ in range(2))
    for step in range(2 * TRIALS + 2):  # both kinds of batch are tried in these
        live = [i for i, s in enumerate(single) if not s.done]
        tokens = {}
        for i in live:
            choice = allowed(reference(single[i].matcher, words), comp.vocab_size)
            tokens[i] = choice[(3 * i + step) % len(choice)]
        if step == 3:
            tokens[live[0]] = comp.vocab_size - 1  # a token no JSON grammar allows here: "error"
        one = [single[i].advance(tokens[i]) for i in live]
        assert advance_all([(batched[i], tokens[i]) for i in live]) == one
        assert step != 3 or one[0] == "error"
        for a, b in zip(batched, single):
            assert a.num_tokens == b.num_tokens and a.done == b.done
            if not a.done:
                assert torch.equal(reference(a.matcher, words), reference(b.matcher, words))
    comp.shutdown()


@pytest.mark.parametrize("overlap,jump_forward", [(True, False), (False, False), (True, True)])
def test_large_constrained_batch_validates_and_keeps_others(model_dir, overlap, jump_forward):
    params = [SamplingParams(max_tokens=240, temperature=1.0, seed=i, logprobs=1 if i % 3 == 0 else None,
                             presence_penalty=0.5 if i % 4 == 0 else 0.0,
                             structured_outputs=SO(json=SCHEMAS[NAMES[i % len(NAMES)]])) for i in range(ROWS)]
    params += [SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)] * 3
    # With jump-forward, the whole batch within its bound: nearly every step drafts (and a
    # drafting step fills its masks itself, so the worker's case is the one without it).
    llm = LLM(model_dir, dtype="float32", overlap_steps=overlap, engine_process=False, jump_forward=jump_forward,
              speculative_max_batch=len(params))
    outs = llm.generate([f"prompt number {i}" for i in range(len(params))], params)
    if jump_forward:
        assert llm.engine.stats().spec_num_drafts > 0
    else:
        assert llm.engine.core.core.structured.timing.waited > 0  # the worker filled masks
    for i, out in enumerate(outs[:ROWS]):
        assert out.outputs[0].finish_reason == "stop", (i, out.outputs[0].text)
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMAS[NAMES[i % len(NAMES)]])
    assert all(len(o.outputs[0].token_ids) == 30 for o in outs[ROWS:])
    llm.shutdown()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_large_batch_overlap_gives_the_same_tokens_as_steps_one_at_a_time(model_dir, device):
    """On CUDA the masks go from pinned buffers, the worker's fill racing the device's forward."""
    params = [SamplingParams(max_tokens=60, temperature=t, seed=i, structured_outputs=SO(json=SCHEMAS[n]))
              for i, (n, t) in enumerate(zip(NAMES * 3, [0.0, 1.0] * 8))]
    prompts = [f"prompt number {i}" for i in range(len(params))]
    runs = []
    for overlap in (True, False):
        llm = LLM(model_dir, device=device, dtype="float32", overlap_steps=overlap, engine_process=False)
        runs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
        llm.shutdown()
    assert runs[0] == runs[1]


def _request(spec: SO):
    from mlxr.engine.records import EngineCoreRequest
    from mlxr.engine.sched.request import Request
    return Request(EngineCoreRequest("r0", [1, 2], SamplingParams(structured_outputs=spec), 16, [2], 0.0))


@pytest.mark.parametrize("value, threads", [("6", 6), (" 12 ", 12), ("", None), ("0", None), ("-2", None),
                                            ("many", None), ("100000", MAX_THREADS)])
def test_grammar_threads_from_the_environment(monkeypatch, value, threads):
    monkeypatch.setenv(THREADS_ENV, value)
    assert threads_from_env() == threads
