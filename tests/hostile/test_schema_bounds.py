"""T10: a schema that passed the admission check made llguidance panic when the engine compiled
it (a 500 with the panic's text): an allOf of anyOf pairs multiplies into a grammar past the
parser's symbol limit. The admission check now refuses it, by its size or by the parser's
own failure on bytes; T14: a Lark grammar's inline %json schema gets a JSON schema's bounds."""
from __future__ import annotations

import time

import llguidance
import pytest

from mlxr.engine.structured.grammar import JSON_STYLE, check, parser_limits
from mlxr.engine.structured.trial import trial_error
from mlxr.errors import InvalidParameterError
from mlxr.types import StructuredOutputsParams


def pair(i: int) -> dict:
    return {"anyOf": [{"type": "object", "properties": {f"a{i}": {"type": "integer"}}, "required": [f"a{i}"]},
                      {"type": "object", "properties": {f"b{i}": {"type": "integer"}}, "required": [f"b{i}"]}]}


def test_an_allof_of_eleven_anyof_pairs_is_refused_by_its_combinations():
    start = time.monotonic()
    with pytest.raises(InvalidParameterError, match="2048 combinations.*MAX_SCHEMA_COMBINATIONS"):
        check(StructuredOutputsParams(json={"allOf": [pair(i) for i in range(11)]}))
    assert time.monotonic() - start < 0.5  # before: 3 s, then the engine's compile panicked


def test_the_trial_reports_a_parser_panic_instead_of_leaving_it_to_the_engine():
    # The schema's grammar as llguidance builds it, past the combination bound: the trial on
    # bytes panics as the engine's compile did, and says so without the panic's text.
    text = llguidance.LLMatcher.grammar_from_json_schema({"allOf": [pair(i) for i in range(11)]}, defaults=JSON_STYLE)
    problem = trial_error(text, parser_limits())
    assert problem and "larger than the parser can hold" in problem
    assert "panic" not in problem and "backtrace" not in problem


def test_a_few_combinations_still_pass():
    assert check(StructuredOutputsParams(json={"allOf": [pair(i) for i in range(3)]}))


@pytest.mark.parametrize("schema,words", [
    ('{"type": "string", "pattern": "^(a{100}){1000}$"}', "nests counted repetitions"),
    ('{"allOf": [%s]}', "combinations"),
])
def test_an_inline_json_schema_in_a_lark_grammar_gets_a_schemas_bounds(schema, words):
    import json
    if "%s" in schema:
        schema = schema % ", ".join(json.dumps(pair(i)) for i in range(11))
    with pytest.raises(InvalidParameterError, match=words):
        check(StructuredOutputsParams(grammar=f"start: obj\nobj: %json {schema}"))
