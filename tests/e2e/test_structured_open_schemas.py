"""Structured output that always ends (issue 45): forty-odd schemas as users write them, with no
bounds of their own on numbers and strings, sampled at temperature 0.8 from the bundled base
model: every reply is valid JSON for its schema and none ends at max_tokens."""
from __future__ import annotations

import json

import jsonschema
import pytest
from open_schemas import OPEN_SCHEMAS

from mlxr.types import SamplingParams, StructuredOutputsParams

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # ~42 sampled replies of up to a few hundred tokens on a 262k vocabulary
MAX_TOKENS = 2048  # the server's --max-tokens-default; a string at its 512-character cap is at most 2,048 byte tokens


def test_every_open_schema_ends_in_valid_json():
    from model_fixtures import cached_llm

    llm = cached_llm("gemma3-270m")
    names = list(OPEN_SCHEMAS)
    assert len(names) >= 40
    prompts = [llm.tokenizer.encode(f"Here is a JSON object ({n.replace('_', ' ')}):\n") for n in names]
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, seed=i,
                             structured_outputs=StructuredOutputsParams(json=OPEN_SCHEMAS[n]))
              for i, n in enumerate(names)]
    outs = llm.generate(prompts, params)
    problems = []
    for name, out in zip(names, outs):
        c = out.outputs[0]
        if c.finish_reason != "stop":
            problems.append(f"{name}: finish_reason {c.finish_reason} after {len(c.token_ids)} tokens: {c.text[:80]!r}")
            continue
        try:
            jsonschema.validate(json.loads(c.text), OPEN_SCHEMAS[name])
        except (ValueError, jsonschema.ValidationError) as e:
            problems.append(f"{name}: {type(e).__name__}: {str(e)[:120]}; {c.text[:80]!r}")
    assert not problems, "\n".join(problems)
