"""An OpenAI/vLLM request's constraint -> StructuredOutputsParams: `response_format`
(json_object; json_schema, strict as OpenAI defines it: strict_schema.py), vLLM's `structured_outputs` body field (json, regex,
choice, grammar, json_object) and its older `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar` names. At most one constraint per request; anything else is a 400."""
from __future__ import annotations

from typing import Any

from mlxr.errors import InvalidParameterError
from mlxr.server.openai.strict_schema import strict_schema
from mlxr.types import StructuredOutputsParams

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_FIELDS = ("json", "json_object", "regex", "choice", "grammar")


def structured_outputs(body: Any) -> StructuredOutputsParams | None:
    """The one constraint the body asks for, or None."""
    found = [(name, spec) for name, spec in (
        ("response_format", _from_response_format(getattr(body, "response_format", None))),
        ("structured_outputs", vllm_constraint(getattr(body, "structured_outputs", None))),
        *((name, _from_guided(name, getattr(body, name, None))) for name in _GUIDED),
    ) if spec is not None]
    if len(found) > 1:
        raise InvalidParameterError(found[1][0], f"give one constraint; {found[0][0]} is already one")
    return found[0][1] if found else None


def _from_response_format(fmt: Any) -> StructuredOutputsParams | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    spec = fmt.json_schema or {}
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise InvalidParameterError("response_format", "json_schema.schema must be a JSON schema object")
    return StructuredOutputsParams(json=strict_schema(schema) if spec.get("strict") is True else schema)


def vllm_constraint(raw: Any) -> StructuredOutputsParams | None:
    """vLLM's `structured_outputs` body field, taken on every API (the Responses, Anthropic and
    Ollama routes too)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InvalidParameterError("structured_outputs", "must be an object")
    given = {k: v for k, v in raw.items() if k in _FIELDS and v not in (None, False)}
    unknown = sorted(set(raw) - set(_FIELDS) - {"disable_any_whitespace", "disable_fallback",
                                                  "disable_additional_properties", "whitespace_pattern"})
    if unknown:
        raise InvalidParameterError("structured_outputs", f"unknown fields {unknown}")
    if not given:
        return None
    return StructuredOutputsParams(**given)


def _from_guided(name: str, value: Any) -> StructuredOutputsParams | None:
    if value is None:
        return None
    if name == "guided_json" and not isinstance(value, (dict, str)):
        raise InvalidParameterError(name, "must be a JSON schema (an object or its JSON text)")
    return StructuredOutputsParams(**{_GUIDED[name]: value})
