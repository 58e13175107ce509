"""A JSON schema's open-ended literals are bounded before llguidance compiles it
(mlxr/engine/structured/json_bounds.py): a number's digits, a string's length; uniqueItems is
accepted. Checked on llguidance's own matcher over a vocabulary of single bytes."""
from __future__ import annotations

import llguidance
import pytest

from mlxr.engine.structured.grammar import check, grammar_text
from mlxr.engine.structured.json_bounds import STRING_MAX_CHARS, bounded_schema
from mlxr.engine.structured.trial import byte_vocabulary
from mlxr.types import StructuredOutputsParams as SO

SCORE = {"type": "object", "properties": {"score": {"type": "number"}, "n": {"type": "integer"},
                                          "s": {"type": "string"}}, "required": ["score", "n", "s"]}


def follows(schema: dict, text: str) -> bool:
    m = llguidance.LLMatcher(byte_vocabulary(), grammar_text(SO(json=schema)), log_level=0)
    return m.consume_tokens(list(text.encode())) and not m.is_error()


@pytest.mark.parametrize("text", ['{"score": 1.5, "n": 3, "s": "ab"}', '{"score": -0.0000000001, "n": -7, "s": ""}',
                                  '{"score": 12345678901234567, "n": 100000000000000000, "s": "x"}'])
def test_ordinary_numbers_and_strings_still_follow(text):
    assert follows(SCORE, text)


@pytest.mark.parametrize("text", [
    '{"score": 1.' + "0" * 11,  # the digits a sampled model wrote until max_tokens
    '{"score": 1' + "1" * 17,  # 18 integer digits
    '{"score": 1e5',  # no exponent
    '{"score": 1.5, "n": 1' + "0" * 18,
    '{"score": 1.5, "n": 3, "s": "' + "a" * (STRING_MAX_CHARS + 1),
])
def test_unbounded_literals_are_cut_off(text):
    assert not follows(SCORE, text)


def test_a_schemas_own_bounds_win():
    own = {"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0.5, "maximum": 3},
                                            "s": {"type": "string", "maxLength": 9000}}, "required": ["x", "s"]}
    assert follows(own, '{"x": 2.5, "s": "' + "a" * 9000 + '"}')
    assert not follows(own, '{"x": 3.5')


def test_data_keywords_and_property_names_are_left_alone():
    doc = {"type": "object", "properties": {"uniqueItems": {"const": {"type": "number"}}},
           "default": {"type": "string"}, "enum": [{"type": "number"}]}
    assert bounded_schema(doc) == doc


def test_listed_values_keep_their_digits():
    listed = {"type": "object", "properties": {"pi": {"type": "number", "const": 3.14159265358979},
                                               "e": {"type": "number", "enum": [2.718281828459045]}}, "required": ["pi", "e"]}
    assert follows(listed, '{"pi": 3.14159265358979, "e": 2.718281828459045}')


def test_unique_items_is_accepted():
    spec = SO(json={"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3}, "uniqueItems": True})
    check(spec)
    assert follows(spec.json, "[1, 2]")


def test_an_object_that_says_nothing_of_other_keys_takes_no_others():
    point = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
             "required": ["x", "y"]}
    assert follows(point, '{"x": 2, "y": 3}')
    assert not follows(point, '{"x": 2, "y": 3, "p1x"')  # what a sampled model wrote until max_tokens
    nested = {"type": "object", "properties": {"p": point}, "required": ["p"]}
    assert not follows(nested, '{"p": {"x": 2, "y": 3, "z"')


def test_objects_that_allow_other_keys_or_merge_under_all_of_keep_them():
    open_point = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
                  "additionalProperties": True}
    assert follows(open_point, '{"x": 2, "y": 3}')
    merged = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                        {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]}
    assert all("additionalProperties" not in branch for branch in bounded_schema(merged)["allOf"])


UNENFORCED = [  # (a property's schema llguidance cannot enforce, a value for it)
    ({"type": "string", "format": "password"}, '"s3cret"'), ({"type": "integer", "format": "int64"}, "5"),
    ({"type": "string", "format": "binary"}, '"AA"'), ({"not": {"type": "string"}}, "5"),
    ({"type": "array", "contains": {"type": "integer"}, "minContains": 1}, "[1]"),
    ({"type": "string", "if": {"maxLength": 2}, "then": {"pattern": "a"}}, '"ab"'),
]


@pytest.mark.parametrize("field,value", UNENFORCED, ids=["password", "int64", "binary", "not", "contains", "if-then"])
def test_unknown_formats_and_unimplemented_keywords_are_accepted_not_enforced(field, value):
    schema = {"type": "object", "properties": {"x": field}, "required": ["x"]}
    check(SO(json=schema))
    assert follows(schema, '{"x": ' + value + "}")


def test_the_formats_llguidance_knows_are_still_enforced():
    for fmt, good, bad in (("email", '"a@b.co"', '"not an email"'), ("uuid", '"123e4567-e89b-12d3-a456-426614174000"',
                           '"123"'), ("date", '"2026-12-02"', '"02/12/2026"')):
        schema = {"type": "object", "properties": {"x": {"type": "string", "format": fmt}}, "required": ["x"]}
        assert follows(schema, '{"x": ' + good + "}") and not follows(schema, '{"x": ' + bad + "}"), fmt
