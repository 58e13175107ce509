"""JSON schemas for the structured-output tests: every kind the issue names (nested objects,
arrays with min/max items, enums, patterns, numbers with ranges, anyOf, $ref, optional fields,
unicode strings), each bounded so that a random-weight model, which the mask alone steers,
finishes well inside the test's max_tokens."""
from __future__ import annotations

S = {"type": "string", "maxLength": 6}
INT = {"type": "integer", "minimum": -50, "maximum": 50}


def obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required, "additionalProperties": False}


SCHEMAS: dict[str, dict] = {
    "string": obj({"s": S}),
    "integer_range": obj({"n": INT}),
    "integer_positive": obj({"n": {"type": "integer", "minimum": 1, "maximum": 9999}}),
    "number_range": obj({"x": {"type": "number", "minimum": 0, "maximum": 1}}),
    "number_negative": obj({"x": {"type": "number", "minimum": -10.5, "maximum": -0.5}}),
    "boolean": obj({"b": {"type": "boolean"}}),
    "null": obj({"z": {"type": "null"}}),
    "enum_strings": obj({"color": {"enum": ["red", "green", "blue"]}}),
    "enum_mixed": obj({"v": {"enum": [1, "two", None, True, 3.5]}}),
    "const": obj({"kind": {"const": "point"}}),
    "pattern_code": obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}),
    "pattern_date": obj({"d": {"type": "string", "pattern": "^20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]$"}}),
    "string_min_max": obj({"s": {"type": "string", "minLength": 2, "maxLength": 4}}),
    "array_min_max": obj({"a": {"type": "array", "items": INT, "minItems": 2, "maxItems": 4}}),
    "array_exact": obj({"a": {"type": "array", "items": {"type": "boolean"}, "minItems": 3, "maxItems": 3}}),
    "array_of_enums": obj({"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1,
                                    "maxItems": 3}}),
    "array_of_objects": obj({"pts": {"type": "array", "items": obj({"x": INT, "y": INT}), "minItems": 1,
                                     "maxItems": 2}}),
    "empty_array_allowed": obj({"a": {"type": "array", "items": S, "maxItems": 0}}),
    "nested_2": obj({"outer": obj({"inner": S, "n": INT})}),
    "nested_3": obj({"a": obj({"b": obj({"c": {"type": "boolean"}})})}),
    "nested_mixed": obj({"user": obj({"name": S, "roles": {"type": "array", "items": {"enum": ["admin", "dev"]},
                                                           "minItems": 1, "maxItems": 2}}), "active": {"type": "boolean"}}),
    "optional_fields": obj({"id": INT, "nick": S, "age": INT}, required=["id"]),
    "all_optional": obj({"p": {"type": "boolean"}, "q": INT}, required=[]),
    "anyof_scalar": obj({"v": {"anyOf": [INT, {"type": "null"}]}}),
    "anyof_objects": obj({"shape": {"anyOf": [obj({"r": INT}), obj({"w": INT, "h": INT})]}}),
    "anyof_string_or_bool": obj({"v": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "boolean"}]}}),
    "nullable_type_list": obj({"v": {"type": ["integer", "null"], "minimum": 0, "maximum": 5}}),
    "ref_defs": {"$defs": {"pt": obj({"x": INT, "y": INT})}, **obj({"p": {"$ref": "#/$defs/pt"}})},
    "ref_twice": {"$defs": {"c": {"enum": ["x", "y"]}},
                  **obj({"a": {"$ref": "#/$defs/c"}, "b": {"$ref": "#/$defs/c"}})},
    "ref_nested": {"$defs": {"leaf": obj({"v": {"type": "boolean"}}), "node": obj({"leaf": {"$ref": "#/$defs/leaf"}})},
                   **obj({"root": {"$ref": "#/$defs/node"}})},
    "unicode_enum": obj({"word": {"enum": ["café", "日本語", "naïve", "😀"]}}),
    "unicode_const": obj({"greeting": {"const": "Grüße, мир!"}}),
    "unicode_pattern": obj({"s": {"type": "string", "pattern": "^[α-ω]{1,4}$"}}),
    "unicode_keys": obj({"名前": S, "größe": INT}),
    "many_fields": obj({f"f{i}": {"type": "boolean"} for i in range(8)}),
    "top_level_array": {"type": "array", "items": INT, "minItems": 1, "maxItems": 3},
    "top_level_enum": {"enum": ["yes", "no", "maybe"]},
    "top_level_integer": {"type": "integer", "minimum": 100, "maximum": 200},
    "exclusive_range": obj({"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 4}}),
    "escaped_const": obj({"q": {"const": "say \"hi\"\\n"}}),
    "array_nested_arrays": obj({"m": {"type": "array", "items": {"type": "array", "items": {"type": "boolean"},
                                                                  "minItems": 1, "maxItems": 2},
                                      "minItems": 1, "maxItems": 2}}),
    "record_like": obj({"id": {"type": "integer", "minimum": 1, "maximum": 99},
                        "email": {"type": "string", "pattern": "^[a-z]{1,5}@[a-z]{1,5}\\.(com|org)$"},
                        "score": {"type": "number", "minimum": 0, "maximum": 5},
                        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}}),
}

# A few of every kind, for the routes that do not run the whole suite.
FAST = ["nested_mixed", "array_min_max", "enum_strings", "pattern_code", "number_range", "anyof_objects",
        "ref_defs", "optional_fields", "unicode_enum", "unicode_pattern"]
