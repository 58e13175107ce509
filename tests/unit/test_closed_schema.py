"""Object schemas closed where they say nothing of other properties (what keeps a grammar from
adding keys without end: pydantic writes no additionalProperties, so a forced call's arguments
ran to max_tokens), validated with jsonschema: what the closed schema takes, and that merged
parts (allOf, $ref) stay open so their properties still validate."""
from __future__ import annotations

import jsonschema
import pytest

from mlxr.engine.structured.json_bounds import bounded_schema as closed_schema

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {
    "type": "object", "properties": {"k": {"type": "string"}}}}, "pet": {"anyOf": [
        {"type": "object", "properties": {"cat": {"type": "boolean"}}}, {"type": "null"}]},
    "home": {"$ref": "#/$defs/Home"}}, "$defs": {"Home": {"properties": {"city": {"type": "string"}}}}}


@pytest.mark.parametrize(("instance", "valid"), [
    ({"name": "a", "tags": [{"k": "x"}], "pet": {"cat": True}, "home": {"city": "b"}}, True),
    ({"name": "a", "extra": 1}, False),
    ({"tags": [{"k": "x", "extra": 1}]}, False),
    ({"pet": {"cat": True, "extra": 1}}, False),
    ({"home": {"city": "b", "extra": 1}}, False),
])
def test_closed_schema_refuses_other_properties_at_every_depth(instance, valid):
    closed = closed_schema(PERSON)
    jsonschema.validate(instance, PERSON)  # the schema as given takes them all
    assert jsonschema.Draft202012Validator(closed).is_valid(instance) is valid
    assert "additionalProperties" not in PERSON  # a copy is rewritten


def test_explicit_choices_and_merged_parts_stay_as_given():
    open_map = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert closed_schema(open_map)["additionalProperties"]["type"] == "integer"  # bounded, still open
    assert jsonschema.Draft202012Validator(closed_schema(open_map)).is_valid({"any": 3})
    merged = {"type": "object", "properties": {"a": {"type": "string"}},
              "allOf": [{"type": "object", "properties": {"b": {"type": "string"}}}]}
    closed = closed_schema(merged)
    assert jsonschema.Draft202012Validator(closed).is_valid({"a": "x", "b": "y"})
