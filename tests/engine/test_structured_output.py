"""Structured output through the Python API on a random-weight model, where nothing but the
grammar mask can produce JSON: every schema of the suite validates with jsonschema; regex,
choice and Lark grammars hold; batching, n > 1, seeds, logprobs, penalties, stop strings,
overlapped steps and preemption keep every constrained output valid and leave others alone."""
from __future__ import annotations

import json
import re

import jsonschema
import llguidance.numpy as llg_np
import numpy as np
import pytest
import torch

from model_fixtures import cached_llm, fixture_model
from structured_schemas import SCHEMAS
from mlxr import LLM, SamplingParams
from mlxr.errors import InvalidParameterError
from mlxr.ops.sampling.sampling import apply_token_bitmask_
from mlxr.types import StructuredOutputsParams as SO

PROMPT = "Hello"
RECORD = SCHEMAS["record_like"]


@pytest.fixture(scope="module")
def model_dir():
    return str(fixture_model("tiny-llama").hf_dir)


@pytest.fixture(scope="module")
def llm(model_dir):
    return cached_llm(model_dir)


def run(llm, spec: SO | None, prompts=PROMPT, **kw):
    kw = {"max_tokens": 240, "temperature": 1.0, "seed": 3, **kw}
    return [c for o in llm.generate(prompts, SamplingParams(structured_outputs=spec, **kw)) for c in o.outputs]


def valid(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_schema_of_the_suite_validates(llm, name):
    out = run(llm, SO(json=SCHEMAS[name]))[0]
    assert out.finish_reason == "stop", out.text
    valid(out.text, SCHEMAS[name])


def test_without_the_mask_the_model_writes_no_json(llm):
    for out in run(llm, None, n=4, max_tokens=30):
        with pytest.raises(ValueError):
            json.loads(out.text)


def test_regex_choice_and_lark_grammar(llm):
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", run(llm, SO(regex=r"[0-9]{3}-[a-z]{2}"))[0].text)
    choices = ["yes", "no", "日本 \"q\""]
    assert {run(llm, SO(choice=choices), seed=s)[0].text for s in range(6)} <= set(choices)
    lark = 'start: "(" item ("," item)* ")"\nitem: /[a-c]{1,3}/'
    assert re.fullmatch(r"\([a-c]{1,3}(,[a-c]{1,3})*\)", run(llm, SO(grammar=lark))[0].text)


def test_n_seeds_logprobs_penalties_and_batching(llm):
    kw = dict(n=3, logprobs=2, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.3)
    first = run(llm, SO(json=RECORD), [PROMPT, "Other prompt"], **kw)
    again = run(llm, SO(json=RECORD), [PROMPT, "Other prompt"], **kw)
    assert [o.text for o in first] == [o.text for o in again]  # seeded: reproducible
    assert len({o.text for o in first}) > 1
    for out in first:
        valid(out.text, RECORD)
        assert len(out.logprobs) == len(out.token_ids)
        assert all(lp[t].logprob > -1e4 for lp, t in zip(out.logprobs, out.token_ids))


def test_stop_string_cuts_a_constrained_output(llm):
    out = run(llm, SO(json=RECORD), stop=['"score"'])[0]
    assert out.finish_reason == "stop" and out.text.startswith('{"id": ') and '"score"' not in out.text


def test_a_constrained_row_leaves_its_neighbours_alone(llm):
    plain = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    alone = llm.generate(["The weather"], plain)[0].outputs[0].token_ids
    mixed = llm.generate(["The weather", PROMPT], [plain, SamplingParams(
        max_tokens=240, temperature=0, structured_outputs=SO(json=RECORD))])
    assert mixed[0].outputs[0].token_ids == alone
    valid(mixed[1].outputs[0].text, RECORD)


ENGINES = {
    "overlap": dict(overlap_steps=True),
    "preempt": dict(num_kv_blocks=40, block_size=4, max_num_batched_tokens=64, enable_prefix_caching=False),
    "preempt-overlap": dict(num_kv_blocks=40, block_size=4, max_num_batched_tokens=64, enable_prefix_caching=False,
                            overlap_steps=True),
    "process": dict(engine_process=True, overlap_steps=True),  # the core loads its own tokenizer
}


# record_like with an integer score: a number's fraction has no bound, and a sampled one once ran
# past max_tokens inside it. Each schema below bounds its text (no free whitespace, strings of at
# most 6 characters, integer ranges, enums): 104 bytes at most (many_fields), so fewer tokens
# than max_tokens whatever the sampled path, and every output must stop, not only be a prefix.
BOUNDED_RECORD = {**RECORD, "properties": {**RECORD["properties"], "score": {"type": "integer", "minimum": 0,
                                                                             "maximum": 5}}}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_overlapped_steps_preemption_and_core_process(model_dir, engine):
    """With overlap, a constrained step lands the previous one between its forward and its
    sampling; a tiny KV cache preempts and recomputes: the matchers must stay in step."""
    kw = ENGINES[engine]
    llm = LLM(model_dir, dtype="float32", **kw)
    schemas = [SCHEMAS["nested_mixed"], BOUNDED_RECORD, SCHEMAS["array_of_objects"], SCHEMAS["many_fields"]]
    params = [SamplingParams(max_tokens=120, temperature=1.0, seed=i, structured_outputs=SO(json=schema))
              for i, schema in enumerate(schemas)]
    params += [SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)] * 4
    outs = llm.generate([f"prompt number {i}" for i in range(8)], params)
    for schema, out in zip(schemas, outs):
        assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
        valid(out.outputs[0].text, schema)
    assert all(len(o.outputs[0].token_ids) == 40 for o in outs[4:])
    if engine.startswith("preempt"):
        assert llm.engine.stats().num_preemptions > 0
    assert llm.engine.stats().kv_blocks_used == 0
    llm.shutdown()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_overlap_gives_the_same_tokens_as_steps_one_at_a_time(model_dir, device):
    """Under overlap a constrained step's forward is queued a call ahead of its sampling
    (core/in_flight.py, StepsInFlight.forward_ahead); greedy and seeded rows, constrained or not,
    must not notice."""
    names = ["nested_mixed", "record_like", "enum_strings"]
    params = [SamplingParams(max_tokens=100, temperature=t, seed=i, structured_outputs=SO(json=SCHEMAS[n]))
              for i, (n, t) in enumerate(zip(names * 2, [0.0] * 3 + [1.0] * 3))]
    params += [SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)] * 2
    prompts = [f"prompt number {i}" for i in range(len(params))]
    runs = []
    for overlap in (True, False):
        llm = LLM(model_dir, device=device, dtype="float32", overlap_steps=overlap, engine_process=False)
        assert llm.engine.core.core.overlap is overlap
        runs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
        llm.shutdown()
    assert runs[0] == runs[1]


@pytest.mark.parametrize("spec, words", [
    (SO(json={"type": "integer", "minimum": 5, "maximum": 1}), "minimum"),
    (SO(json={"type": "strin"}), "strin"),
    (SO(json={"$ref": "#/$defs/nope"}), "nope"),
    (SO(regex="(("), "regex"),
    (SO(grammar="start: undefined_rule"), "undefined_rule"),
    (SO(choice=[]), "choice"),
    (SO(json={"type": "integer", "minimum": -(2 ** 63) + 1, "maximum": -(2 ** 63) + 1}), "out of range"),
    (SO(json={"type": "number", "exclusiveMaximum": 1e300}), "exclusiveMaximum"),
    # llguidance fails these on the first tokens (trial.py): the engine failed the running request
    (SO(regex=r"[^\s\S]"), "matches nothing"),
    (SO(grammar='start: "a" start'), "forces text without end"),
])
def test_invalid_specs_are_refused_naming_the_problem(llm, spec, words):
    with pytest.raises(InvalidParameterError, match=re.escape(words)):
        run(llm, spec)


def test_bitmask_op_matches_llguidance_reference():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 70, generator=gen)
    mask = torch.randint(-(1 << 31), 1 << 31, (3, 3), dtype=torch.int64, generator=gen).to(torch.int32)
    ours = logits.clone()
    apply_token_bitmask_(ours, mask)
    ref = logits.numpy().copy()
    llg_np.apply_token_bitmask_inplace(ref, mask.numpy())
    assert np.array_equal(ours.numpy(), ref)


@pytest.mark.gpu
def test_cuda_graphs_and_overlap_keep_constrained_rows_valid(model_dir):
    llm = LLM(model_dir, device="cuda", dtype="float32", engine_process=False)
    assert llm.engine.core.core.overlap
    names = sorted(SCHEMAS)
    params = [SamplingParams(max_tokens=240, temperature=1.0, seed=i, structured_outputs=SO(json=SCHEMAS[n]))
              for i, n in enumerate(names)]
    plain = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    outs = llm.generate([PROMPT] * len(names) + ["The weather"], params + [plain])
    for name, out in zip(names, outs):
        valid(out.outputs[0].text, SCHEMAS[name])
    assert outs[-1].outputs[0].token_ids == llm.generate(["The weather"], plain)[0].outputs[0].token_ids
