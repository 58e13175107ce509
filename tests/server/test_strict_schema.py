"""OpenAI strict mode's schema rewrite against the official openai client's own (the one `.parse`
applies to Pydantic models): on every schema of the structured-output suite, loosened first
(additionalProperties and required dropped), both give the same schema."""
from __future__ import annotations

import copy

import pytest
from openai.lib._pydantic import _ensure_strict_json_schema  # the client's strict rewrite (private name)

from structured_schemas import SCHEMAS
from mlxr.server.openai.strict_schema import strict_schema


def loosened(schema: object) -> object:
    if isinstance(schema, dict):
        return {k: loosened(v) for k, v in schema.items()
                if k not in ("additionalProperties", "required") or not isinstance(v, (bool, list))}
    if isinstance(schema, list):
        return [loosened(v) for v in schema]
    return schema


def openai_strict(schema: dict) -> dict:
    schema = copy.deepcopy(schema)
    return _ensure_strict_json_schema(schema, path=(), root=schema)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_same_rewrite_as_the_official_client(name):
    loose = loosened(SCHEMAS[name])
    assert strict_schema(loose) == openai_strict(loose)


def test_an_explicit_additional_properties_is_kept_and_the_input_untouched():
    schema = {"type": "object", "properties": {"a": {"type": "object", "additionalProperties": {"type": "integer"}}}}
    before = copy.deepcopy(schema)
    out = strict_schema(schema)
    assert schema == before
    assert out["properties"]["a"]["additionalProperties"] == {"type": "integer"} and out["required"] == ["a"]
    assert out == openai_strict(schema)
