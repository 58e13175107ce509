"""Schemas that pass the grammar check, slowly: an array of N consts is forced text the check
takes step by step, ~1.5 s at N = 9,000 on one core (the check's cost grows with N squared)."""
from __future__ import annotations

from typing import Any


def slow_parameters(n: int = 9000) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"type": "array", "minItems": n, "maxItems": n,
                                                   "items": {"const": "abcdefgh"}}}, "required": ["a"]}


def slow_tools(count: int, n: int = 9000) -> list[dict[str, Any]]:
    """Tools whose names start with distinct letters, so a forced call's check tries each."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [{"type": "function", "function": {"name": f"{letters[i % 26]}{i}_tool", "parameters": slow_parameters(n)}}
            for i in range(count)]


def slow_union_schema(count: int, n: int = 9000) -> dict[str, Any]:
    """A union whose members start with distinct letters: the check takes each one's forced array
    (three took 10.7 s on one core)."""
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": f"{c}_tool"}, "arguments": slow_parameters(n)},
                       "required": ["name", "arguments"]} for c in "abcdefghijklmnopqrstuvwxyz"[:count]]}
