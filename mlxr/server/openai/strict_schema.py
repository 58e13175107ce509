"""OpenAI's `strict: true` for a JSON schema: every object schema that does not say otherwise
takes no properties beyond those it lists (`additionalProperties: false`), and every property it
lists is required, as OpenAI's Structured Outputs define strict mode (and as the official
client's `.parse` rewrites Pydantic models). Optional fields are written, as OpenAI asks, as a
union with null. The rewrite walks the schema by keyword, without recursion, on a copy."""
from __future__ import annotations

import copy
from typing import Any

from mlxr.engine.structured.grammar import MAX_JSON_DEPTH, json_depth

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
               "additionalItems", "unevaluatedProperties", "unevaluatedItems")


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """schema with OpenAI's strict defaults; a schema nested too deep is returned as it is (the
    grammar check refuses it, naming the depth)."""
    if json_depth(schema) > MAX_JSON_DEPTH:
        return schema
    root = copy.deepcopy(schema)
    stack = [root]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if _is_object(node) and "additionalProperties" not in node:
            node["additionalProperties"] = False
        if isinstance(node.get("properties"), dict):
            node["required"] = list(node["properties"])
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack.extend(node[key].values())
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                stack.extend(node[key])
        for key in _SCHEMA_ONE:
            value = node.get(key)
            stack.extend(value if isinstance(value, list) else [value])
    return root


_MERGING = ("allOf", "$ref", "patternProperties", "unevaluatedProperties", "if", "dependentSchemas")


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A forced call's parameters with every object schema that says nothing of other
    properties closed (`additionalProperties: false`), as llama.cpp's and xgrammar's grammars
    read such schemas: left open, the grammar lets a model add keys of its own until max_tokens
    (pydantic writes no additionalProperties). An object merged with others (allOf, $ref and
    the like) stays open, since closing one part would refuse the other parts' properties."""
    if json_depth(schema) > MAX_JSON_DEPTH:
        return schema
    root = copy.deepcopy(schema)
    stack = [root]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if _is_object(node) and "additionalProperties" not in node and not any(k in node for k in _MERGING):
            node["additionalProperties"] = False
        for key in ("properties", "$defs", "definitions"):
            if isinstance(node.get(key), dict):
                stack.extend(node[key].values())
        for key in ("anyOf", "oneOf", "prefixItems"):
            if isinstance(node.get(key), list):
                stack.extend(node[key])
        for key in ("items", "additionalProperties"):
            stack.append(node.get(key))
    return root


def strict_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool as the template and the call grammar see it: with `strict: true` its
    parameters take strict_schema's defaults (and the flag itself is dropped)."""
    fn = tool.get("function")
    if isinstance(fn, dict) and fn.pop("strict", None) is True and isinstance(fn.get("parameters"), dict):
        fn["parameters"] = strict_schema(fn["parameters"])
    return tool


def _is_object(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or (
        kind is None and isinstance(node.get("properties"), dict))
