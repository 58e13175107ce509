"""The bound on nested counted repetition (mlxr/engine/structured/regex_bounds.py): the product of
counts nested two or more deep, on the regex syntax llguidance reads; a single large count, and
what is exponential only for backtracking engines, pass."""
from __future__ import annotations

import re

import pytest

from mlxr.engine.structured.grammar import check
from mlxr.engine.structured.regex_bounds import MAX_REPEAT_PRODUCT, repeat_product
from mlxr.errors import InvalidParameterError
from mlxr.types import StructuredOutputsParams as SO


@pytest.mark.parametrize("regex, product", [
    ("a{1000}{1000}", 1_000_000), ("(a{1000}){1000}", 1_000_000), ("((a{1,1000}){1,1000}){1,1000}", 10 ** 9),
    ("(\\d{3}){1,1000}", 3000), ("(ab{2}c){3}{4}", 24), ("(a{3}|b{40}){100}", 4000), ("[]a]{10}{10}", 100),
    ("[a-z]{1,100000}", 1), ("(a|aa)*b", 1), ("(x+x+)+y", 1), ("\\p{L}{5}", 1), ("\\{5}{5}", 1),
    ("[{]{3}(x){2,}", 1), ("a{3}|b{4}", 1), ("(a{2,}){7}", 14),
])
def test_repeat_product(regex, product):
    assert repeat_product(regex) == product


@pytest.mark.parametrize("spec, words", [
    (SO(regex="(a{101}){100}"), "regex nests counted repetitions to 10100 repeats"),
    (SO(json={"type": "object", "properties": {"p": {"type": "string", "pattern": "(x{200}){200}"}}}),
     "json schema pattern '(x{200}){200}'"),
    (SO(json={"type": "object", "patternProperties": {"^(k{200}){200}$": {"type": "integer"}}}), "pattern"),
    (SO(grammar='start: A "!"\nA: /(x{100}){1000}/'), "a regex of the grammar"),
])
def test_nested_counts_are_refused_naming_the_regex(spec, words):
    with pytest.raises(InvalidParameterError, match=re.escape(words)):
        check(spec)


def test_what_is_cheap_for_llguidance_passes():
    for regex in ["(a|aa)*b", "(x+x+)+y", "[a-z]{1,100000}", "(a{100}){100}"]:
        assert check(SO(regex=regex))
    assert repeat_product("(a{100}){100}") == MAX_REPEAT_PRODUCT
