"""The frontend's trial of a grammar's first steps on a vocabulary of single bytes
(mlxr/engine/structured/trial.py): what llguidance fails on the first tokens of a request is a
400 naming the problem; what it follows, or can only judge with the model's vocabulary, passes."""
from __future__ import annotations

import time

import pytest

from structured_schemas import SCHEMAS
from mlxr.chat.tools.generic import GENERIC
from mlxr.engine.structured.grammar import check, grammar_text, parser_limits
from mlxr.engine.structured.trial import trial_error
from mlxr.errors import InvalidParameterError
from mlxr.types import StructuredOutputsParams as SO

THINK = ("<think>", "</think>")


@pytest.mark.parametrize("spec, words", [
    (SO(json={"$ref": "#"}), "the grammar matches nothing: no text satisfies it"),
    (SO(json={"anyOf": [{"$ref": "#"}, {"$ref": "#"}]}), "matches nothing"),
    (SO(regex=r"[^\s\S]"), "matches nothing"),
    (SO(regex=r"x[^\s\S]", reasoning=THINK), "matches nothing"),  # the grammar after the reasoning
    (SO(grammar='start: "a" | "b" dead\ndead: /[^\\s\\S]/'), "matches nothing after 'b'"),
    (SO(json={"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}), "forces text without end"),
    (SO(json={"type": "array", "items": {"$ref": "#"}, "minItems": 1}), "forces text without end"),
    (SO(grammar='start: "a" start'), "50000 parser items"),
    (SO(grammar="start: " + " | ".join(f'"w{i}"' for i in range(2001))), "2002 alternatives at one point"),
    (SO(grammar='start: "q" x\nx: ' + " | ".join(f'"{i}"' for i in range(3000))), "3001 alternatives"),
    (SO(grammar='start: "q" | "r" x\nx: ' + " | ".join(f'"{i}"' for i in range(3000))), "3001 alternatives at one point after 'r'"),
    (SO(json=GENERIC.call_schema("f", {"$ref": "#"})), "matches nothing"),
])
def test_grammars_that_fail_on_their_first_tokens_are_refused(spec, words):
    with pytest.raises(InvalidParameterError, match="structured_outputs: ") as e:
        check(spec)
    assert words in str(e.value)


@pytest.mark.parametrize("spec", [
    *(SO(json=schema) for schema in SCHEMAS.values()),
    SO(json={"type": "object", "properties": {"a": {"$ref": "#"}}}),  # may stop: {}
    SO(json={"type": "array", "items": {"$ref": "#"}}),
    SO(grammar='start: "a" start | "b"'),
    SO(grammar='start: "(" start ")" | "x"'),
    SO(regex="a{0}"), SO(grammar='start: ""'), SO(json={"type": "string", "maxLength": 0}),  # only the empty text
    SO(choice=[f"c{i}" for i in range(1024)]),
    SO(json={"type": "integer"}, reasoning=THINK),
    SO(json=GENERIC.call_schema("f", {"$defs": {"D": {"type": "integer"}}, "type": "object",
                                      "properties": {"v": {"$ref": "#/$defs/D"}}, "required": ["v"]})),
], ids=lambda spec: str(spec)[:60])
def test_grammars_a_request_can_follow_pass(spec):
    check(spec)


@pytest.mark.parametrize("grammar", [
    'start: "hi" <|im_end|>',  # a special token by name: only the model's vocabulary has it
    'start: "x" <[300]>',  # a token id past the byte vocabulary
    'start: "x" <[5]>',
])
def test_what_only_the_model_vocabulary_can_judge_is_left_to_the_engine(grammar):
    assert trial_error(grammar, parser_limits()) is None


def test_the_trial_is_cheap():
    texts = [grammar_text(SO(json=schema)) for schema in SCHEMAS.values()]
    start = time.perf_counter()
    for text in texts:
        assert trial_error(text, parser_limits()) is None
    assert (time.perf_counter() - start) / len(texts) < 0.05  # ~1 ms each on a loaded 2-core host
