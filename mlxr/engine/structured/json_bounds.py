"""A JSON schema's open-ended literals bounded before llguidance compiles it, so every schema's
output ends. A number with no bounds of its own took digits until max_tokens on a sampled model
(`"score": 1.0000000000...`), and a string without maxLength text without end.

What is added, only where the schema says nothing itself:
- "number": at most NUMBER_FRACTION_DIGITS digits after the point (a multipleOf of 1e-10:
  llguidance refuses finer steps, "too many digits") and no exponent (llguidance writes none
  under a multipleOf), with minimum/maximum at +-1e17 (17 integer digits, what a double holds);
- "integer": minimum/maximum at +-1e17;
- "string": maxLength STRING_MAX_CHARS (a schema's own maxLength overrides it).
Whitespace is already bounded: grammar.JSON_STYLE allows none outside strings.

"uniqueItems" (which llguidance does not implement: it refused the schema with a 400) is taken
out of the grammar: the schema is accepted and its arrays' items are not kept apart.

An object schema ({"type": "object"} with "properties") that says nothing of other keys gets
"additionalProperties": false, as vLLM's xgrammar backend treats it by default (its strict
mode): a sampled model otherwise adds keys without end ({"x": 2, "y": 3, "p1x": 4, "p2x": ...}
until max_tokens). Objects anywhere under allOf, and those holding one, keep the JSON Schema default,
since another branch may define the keys."""
from __future__ import annotations

import copy

NUMBER_FRACTION_DIGITS = 10
NUMBER_STEP = 1e-10  # 10 ** -NUMBER_FRACTION_DIGITS
INTEGER_BOUND = 10 ** 17
STRING_MAX_CHARS = 512  # a sampled base model filled 8,192 and 1,024 past its max_tokens (digits, nbsp)
# Keywords whose values are JSON data, not schemas: a {"type": "number"} there is a value.
_DATA_KEYS = ("const", "enum", "default", "examples")
_LOWER = ("minimum", "exclusiveMinimum")
_UPPER = ("maximum", "exclusiveMaximum")


def bounded_schema(doc: object) -> object:
    """A copy of the parsed schema doc with the bounds above, without uniqueItems."""
    doc = copy.deepcopy(doc)
    merged = _under_all_of(doc)
    for node in _schema_nodes(doc):
        if _closable(node) and id(node) not in merged:
            node["additionalProperties"] = False
        if isinstance(node.get("uniqueItems"), bool):  # not a property named so
            node.pop("uniqueItems")
        types = node.get("type")
        types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
        if "enum" in node or "const" in node:  # already finite; a bound could exclude a listed value
            continue
        if "number" in types or "integer" in types:
            _bound_number(node, "number" in types)
        if "string" in types and "maxLength" not in node:
            node["maxLength"] = STRING_MAX_CHARS
    return doc


def _bound_number(node: dict, fractional: bool) -> None:
    if not any(k in node for k in _LOWER):
        node["minimum"] = -INTEGER_BOUND
    if not any(k in node for k in _UPPER):
        node["maximum"] = INTEGER_BOUND
    if fractional and "multipleOf" not in node:
        node["multipleOf"] = NUMBER_STEP


_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf", "$ref", "if",
              "dependentSchemas", "enum", "const")


def _closable(node: dict) -> bool:
    """An object schema listing its properties (typed "object", or untyped as pydantic's $defs
    may be) that says nothing of other keys and merges with nothing."""
    types = node.get("type")
    is_object = types is None or types == "object" or (isinstance(types, list) and "object" in types)
    return is_object and isinstance(node.get("properties"), dict) and not any(k in node for k in _OPEN_KEYS)


def _under_all_of(doc: object) -> set[int]:
    """ids of every schema inside an allOf (an anyOf of objects there is merged too)."""
    return {id(inner) for node in _schema_nodes(doc) if isinstance(node.get("allOf"), list)
            for inner in _schema_nodes(node["allOf"]) if isinstance(inner, dict)}


def _schema_nodes(doc: object):
    """Every dict in doc outside the data keywords (const, enum, default, examples), no recursion."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(v for k, v in node.items() if k not in _DATA_KEYS and isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (dict, list)))
