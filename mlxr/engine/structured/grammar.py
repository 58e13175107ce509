"""A StructuredOutputsParams -> llguidance grammar text, with the bounds a request may not pass,
and the check that gives a clear 400 before a request reaches the engine core. No torch here."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict

import llguidance

from mlxr.engine.structured.json_bounds import bounded_schema
from mlxr.engine.structured.reasoning_grammar import after_reasoning
from mlxr.engine.structured.regex_bounds import check_regex, lark_regexes, schema_objects, schema_patterns
from mlxr.engine.structured.trial import trial_error
from mlxr.errors import InvalidParameterError
from mlxr.types import StructuredOutputsParams

PARAM = "structured_outputs"
MAX_SPEC_BYTES = 64 * 1024  # a schema, regex or grammar as text
MAX_CHOICES = 1024
MAX_CHOICE_CHARS = 1024
MAX_JSON_DEPTH = 64  # nesting of the schema document itself
# An allOf's members' anyOf/oneOf choices multiply: llguidance expands every combination, and
# 2**11 (eleven pairs) made a grammar that panics it. 2**8 compile in ~0.5 s on bytes.
MAX_SCHEMA_COMBINATIONS = 256

# llguidance's parser limits (its defaults are generous for server use): fuel bounds the work
# of building the lexer and of each token's mask, so a hostile regex is refused or cut short,
# never exponential; the grammar size bounds what a schema may expand to.
LIMITS = dict(max_grammar_size=200_000, max_lexer_states=100_000,
              initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, step_max_items=50_000)


# JSON as models usually write it, one space after ':' and ','; no free whitespace, so a model
# cannot spend its tokens on blanks (a schema's "x-guidance" options still override these).
# Lenient: a `format` llguidance does not know (pydantic's "password", OpenAPI's "int64") and the
# keywords it does not implement (not, if/then, contains, propertyNames...) are accepted and not
# enforced, where they were a 400; the formats it knows are still enforced.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


def parser_limits() -> llguidance.LLParserLimits:
    return llguidance.LLParserLimits(**LIMITS)


def grammar_text(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar for spec; raises InvalidParameterError for what is too big."""
    if spec.json_object:
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_STYLE)
    if spec.json is not None:
        return llguidance.LLMatcher.grammar_from_json_schema(_schema_text(spec.json), defaults=JSON_STYLE)
    if spec.regex is not None:
        return llguidance.LLMatcher.grammar_from_regex(_regexes_bounded("regex", _bounded("regex", spec.regex)))
    if spec.choice is not None:
        return llguidance.LLMatcher.grammar_from_lark(_choice_lark(spec.choice))
    grammar = _bounded("grammar", spec.grammar)
    for regex in lark_regexes(grammar):
        _regexes_bounded("a regex of the grammar", regex)
    return llguidance.LLMatcher.grammar_from_lark(_lark_bounded(grammar))


def _regexes_bounded(what: str, regex: str) -> str:
    problem = check_regex(what, regex)
    if problem:
        raise InvalidParameterError(PARAM, problem)
    return regex


def _bounded(what: str, text: object) -> str:
    if not isinstance(text, str) or not text:
        raise InvalidParameterError(PARAM, f"{what} must be a non-empty string")
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise InvalidParameterError(PARAM, f"{what} is over {MAX_SPEC_BYTES} bytes")
    return text


def _schema_text(schema: dict | str) -> str:
    if isinstance(schema, dict):
        schema = json.dumps(schema, separators=(",", ":"))
    text = _bounded("json schema", schema)
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise InvalidParameterError(PARAM, f"json schema is not valid JSON: {e}") from None
    if not isinstance(doc, (dict, bool)):
        raise InvalidParameterError(PARAM, "json schema must be a JSON object")
    _schema_bounded(doc, "json schema")
    # the user's bounds are checked above; the ones added here (+-1e17) lie past that check's 2^53
    return json.dumps(bounded_schema(doc), separators=(",", ":"))


def _schema_bounded(doc: object, what: str) -> None:
    """A parsed schema's bounds: nesting, its patterns' counted repetitions, numbers, combinations."""
    if json_depth(doc) > MAX_JSON_DEPTH:
        raise InvalidParameterError(PARAM, f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    for pattern in schema_patterns(doc):
        _regexes_bounded(f"{what} pattern {pattern[:40]!r}", pattern)
    _numbers_bounded(doc)
    _combinations_bounded(doc)


def _combinations_bounded(doc: object) -> None:
    for node in schema_objects(doc):
        members = node.get("allOf")
        if not isinstance(members, list):
            continue
        product = 1
        for member in members:
            if isinstance(member, dict):
                choices = [member.get(k) for k in ("anyOf", "oneOf")]
                product *= max([1, *(len(c) for c in choices if isinstance(c, list))])
        if product > MAX_SCHEMA_COMBINATIONS:
            raise InvalidParameterError(PARAM, f"json schema: an allOf whose members' anyOf/oneOf choices make {product} "
                                               f"combinations (at most MAX_SCHEMA_COMBINATIONS={MAX_SCHEMA_COMBINATIONS})")


# llguidance keeps numeric bounds as 64-bit integers: beyond them it clamps (a 200 whose number
# breaks the schema) or, with both bounds at the 64-bit minimum, crashes the process (1.9.1).
# Bounds are refused past JSON's exact-integer range.
MAX_BOUND = 2 ** 53
BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def _numbers_bounded(doc: object) -> None:
    for node in schema_objects(doc):
        for key in BOUND_KEYS:
            value = node.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not abs(value) < MAX_BOUND:
                raise InvalidParameterError(PARAM, f"json schema {key} {value!r} is out of range: bounds must lie within +-2^53")


_BIG_NUMBER = re.compile(r"\d{16,}|\d[eE]\+?(1[6-9]|[2-9]\d|\d{3,})")


def _lark_bounded(text: str) -> str:
    """A Lark grammar's inline %json schemas get a JSON schema's bounds; the numeric one also
    conservatively: no 16-digit number (or exponent of 16 or more) in a grammar that holds one."""
    if "%json" in text and _BIG_NUMBER.search(text):
        raise InvalidParameterError(PARAM, "grammar: a %json schema's numbers must lie within +-2^53")
    for doc in _inline_schemas(text):
        _schema_bounded(doc, "grammar: a %json schema")
    return text


_INLINE_JSON = re.compile(r"%json\s*")


def _inline_schemas(text: str) -> list[object]:
    """The schemas after each `%json` that parse as JSON (llguidance reports those that do not)."""
    decoder, found = json.JSONDecoder(), []
    for m in _INLINE_JSON.finditer(text):
        try:
            found.append(decoder.raw_decode(text, m.end())[0])
        except ValueError:
            continue
    return found


def json_depth(doc: object) -> int:
    """Nesting depth of a parsed JSON document, without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_JSON_DEPTH:
            break
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack += [(c, d + 1) for c in children if isinstance(c, (dict, list))]
    return deepest


def _choice_lark(choices: list[str]) -> str:
    if not isinstance(choices, list) or not choices or len(choices) > MAX_CHOICES:
        raise InvalidParameterError(PARAM, f"choice must be a list of 1 to {MAX_CHOICES} strings")
    for c in choices:
        if not isinstance(c, str) or not c or len(c) > MAX_CHOICE_CHARS:
            raise InvalidParameterError(PARAM, f"each choice must be 1 to {MAX_CHOICE_CHARS} characters")
    return "start: " + " | ".join(json.dumps(c) for c in choices)


def spec_key(spec: StructuredOutputsParams) -> str:
    """The content hash a compiled grammar is cached under."""
    fields = [spec.json if not isinstance(spec.json, dict) else json.dumps(spec.json, sort_keys=True),
              spec.json_object, spec.regex, spec.choice, spec.grammar, spec.reasoning]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()


class _Checked:
    """Specs already checked (by content hash), so the engine thread does not check them again."""

    def __init__(self, size: int = 1024) -> None:
        self.size, self.keys, self.lock = size, OrderedDict(), threading.Lock()

    def __contains__(self, key: str) -> bool:
        with self.lock:
            if key in self.keys:
                self.keys.move_to_end(key)
                return True
            return False

    def add(self, key: str) -> None:
        with self.lock:
            self.keys[key] = None
            while len(self.keys) > self.size:
                self.keys.popitem(last=False)


_CHECKED = _Checked()


def checked_before(spec: StructuredOutputsParams) -> bool:
    return spec_key(spec) in _CHECKED


def mark_checked(spec: StructuredOutputsParams) -> None:
    """spec passed check() elsewhere (its worker process: check_process.py)."""
    _CHECKED.add(spec_key(spec))


def admitted_text(spec: StructuredOutputsParams) -> str:
    """The grammar text of a spec that passed check() at admission (the frontend's Processor
    checks every request before the engine core sees it). The core builds it without checking
    again: in a core process of its own the check's steps held the GIL for seconds (5 s for a
    schema the admission budget let through), stalling every stream's step."""
    grammar = grammar_text(spec)
    return grammar if spec.reasoning is None else after_reasoning(grammar, *spec.reasoning)


def check(spec: StructuredOutputsParams) -> str:
    """The grammar text of spec if llguidance accepts it; else InvalidParameterError naming
    the problem (an invalid or unsatisfiable schema, a bad regex or grammar, one that fails on
    its first tokens: trial.py). The text is bounded and llguidance's limits bound the compile
    and each step, but a step may still take seconds with the GIL held: a request's checks run
    in check_process.py, which stops them at its budget."""
    grammar = grammar_text(spec)
    text = grammar if spec.reasoning is None else after_reasoning(grammar, *spec.reasoning)
    key = spec_key(spec)
    if key in _CHECKED:
        return text
    try:
        error = llguidance.LLMatcher.validate_grammar(text, limits=parser_limits())
    except (ValueError, RuntimeError) as e:
        error = str(e)
    if error:
        raise InvalidParameterError(PARAM, _first_line(error))
    problem = trial_error(grammar, parser_limits())  # the grammar itself, not the reasoning before it
    if problem:
        raise InvalidParameterError(PARAM, problem)
    _CHECKED.add(key)
    return text


def _first_line(error: str) -> str:
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return "; ".join(lines[:3])[:500]
