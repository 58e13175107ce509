"""A constraint that starts after the reasoning (engine/structured/reasoning_grammar.py): the
matcher the engine builds for a request takes any text inside the reasoning block and holds
the reply to the grammar after it; where the prompt opened the block, the block comes first."""
from __future__ import annotations

import pytest

from model_fixtures import cached_llm, fixture_model
from mlxr.engine.structured.compiler import GrammarCompiler
from mlxr.errors import InvalidParameterError
from mlxr.types import StructuredOutputsParams as SO

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def compiler():
    llm = cached_llm(str(fixture_model("tiny-llama").hf_dir))
    return GrammarCompiler(llm.tokenizer, llm.engine.core.core.parts.args.vocab_size), llm.tokenizer


def takes(compiler, spec: SO, text: str) -> tuple[bool, bool]:
    """(every token of text taken, the grammar complete after them)."""
    comp, tok = compiler
    state = comp.compile(spec)
    ok = all(state.matcher.consume_token(t) for t in tok.encode(text, add_special_tokens=False))
    return ok, ok and state.matcher.is_accepting()


@pytest.mark.parametrize("text", ['<think>a { ] "free" text, n = 3?</think>\n\n{"n": 3}', '{"n": 3}'])
def test_the_reply_may_reason_first_then_follows_the_schema(compiler, text):
    assert takes(compiler, SO(json=SCHEMA, reasoning=("<think>", "</think>")), text) == (True, True)


@pytest.mark.parametrize("text", ['<think>ok</think>{"n": "three"}', 'I think {"n": 3}', '<think>ok</think>{"n": 3, "m": 1}'])
def test_after_the_reasoning_the_schema_holds(compiler, text):
    assert takes(compiler, SO(json=SCHEMA, reasoning=("<think>", "</think>")), text)[0] is False


def test_where_the_prompt_opened_the_block_the_reply_reasons_first(compiler):
    spec = SO(json=SCHEMA, reasoning=("", "</think>"))
    assert takes(compiler, spec, 'still thinking {"n": 1}</think>\n{"n": 2}') == (True, True)
    assert takes(compiler, spec, '{"n": 2}') == (True, False)  # only reasoning so far


def test_without_markers_the_grammar_starts_at_once(compiler):
    assert takes(compiler, SO(json=SCHEMA), '<think>x</think>{"n": 3}')[0] is False


def test_markers_are_bounded():
    with pytest.raises(InvalidParameterError, match="reasoning markers"):
        SO(json=SCHEMA, reasoning=("<think>", ""))
    with pytest.raises(InvalidParameterError, match="reasoning markers"):
        SO(json=SCHEMA, reasoning=("<" * 65, "</think>"))
