"""A grammar's first steps, tried on a vocabulary of single bytes before its request is admitted.

llguidance's validate_grammar checks a grammar's form, not whether a request can follow it. A
grammar that matches nothing (the regex `[^\\s\\S]`, a schema that is its own `$ref`) fails at
the engine core's first token mask; one that forces text without end (`start: "a" start`, an
object that requires itself) or offers more alternatives at one point than the parser's row
limit (2,000) fails on the first token taken. There the request was already admitted, so it
failed with a 500. Here the same failures show without the model: 256 single-byte tokens spell
every text, so the grammar's start, its forced text and each byte that may follow are taken (a
few ms at most; the parser limits bound each step) and those errors become a message naming
the problem. Other errors here are the byte vocabulary's own (a special token by name, a token
id past 256): the engine core judges those with the model's vocabulary. A grammar that never
finishes while offering a choice at every step (`start: "a" start | "b" start`) passes: finding
it needs the grammar's rules, which llguidance does not expose; it runs to max_tokens. No torch
here."""
from __future__ import annotations

import re
import threading

import llguidance

EOS = 256
_vocabulary: llguidance.LLTokenizer | None = None
_lock = threading.Lock()


class _Bytes:
    """llguidance.TokenizerWrapper's interface: token b is the byte b, then EOS."""

    eos_token_id, bos_token_id = EOS, None
    tokens = [bytes([b]) for b in range(256)] + [b"</s>"]
    special_token_ids = [EOS]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)


def byte_vocabulary() -> llguidance.LLTokenizer:
    global _vocabulary
    with _lock:
        if _vocabulary is None:
            _vocabulary = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))
        return _vocabulary


def trial_error(text: str, limits: llguidance.LLParserLimits) -> str | None:
    """Why a request under the grammar `text` would fail on its first tokens, or None."""
    root = llguidance.LLMatcher(byte_vocabulary(), text, limits=limits, log_level=0)
    if root.is_error():  # does not build on bytes alone: not this check's to judge, unless the
        return parser_failure(root.get_error())  # parser itself failed, as it will on any vocabulary
    root.compute_bitmask()
    forced = _take_forced(root)
    if root.is_error():
        return describe(root.get_error(), b"")
    if root.is_stopped():
        return None
    for byte in allowed_bytes(root.compute_bitmask()):
        branch = root.deep_copy()
        branch.consume_token(byte)
        _take_forced(branch)
        taken = bytes(t for t in (*forced, byte) if t < EOS)
        if branch.is_error() and (problem := describe(branch.get_error(), taken)):
            return problem
    return None


def _take_forced(matcher: llguidance.LLMatcher) -> list[int]:
    """Take the text the grammar forces next (llguidance computes it on every token taken),
    then compute the mask after it; the forced tokens."""
    if matcher.is_error():
        return []
    forced = matcher.compute_ff_tokens()
    if forced and not matcher.is_error():
        matcher.consume_tokens(forced)
    if not matcher.is_error() and not matcher.is_stopped():
        matcher.compute_bitmask()
    return forced


def allowed_bytes(mask: bytes) -> list[int]:
    bits = int.from_bytes(mask, "little")
    return [b for b in range(256) if bits >> b & 1]


def parser_failure(error: str) -> str | None:
    """llguidance's panic (an assertion of its own, such as a grammar past 65,526 symbols) as a
    message without its backtrace; None for any other error."""
    first = next((line.strip() for line in error.splitlines() if line.strip()), "")
    if not first.startswith("panic"):
        return None
    return ("the grammar is larger than the parser can hold (a schema's allOf of anyOf/oneOf "
            "choices multiplies them); simplify it")


_ROW = re.compile(r"Current row has (\d+) items; max is (\d+)")
_ITEMS = re.compile(r"Too many items \(limit (\d+)")


def describe(error: str, taken: bytes) -> str | None:
    """llguidance's error on the grammar's first steps as what is wrong with the grammar; None
    for an error that is not one of a request's failures at run time."""
    first = next((line.strip() for line in error.splitlines() if line.strip()), "unknown error")
    where = ""
    if taken:
        shown = taken.decode(errors="replace")
        where = f" after {shown[:40] + ('...' if len(shown) > 40 else '')!r}"
    if first.startswith("NoExtensionBias"):
        return f"the grammar matches nothing{where}: no text " + ("can continue it there" if where else "satisfies it")
    if m := _ROW.search(first):
        return (f"the grammar offers {m.group(1)} alternatives at one point{where}, more than the "
                f"parser follows ({m.group(2)})")
    if m := _ITEMS.search(first):
        return (f"the grammar needs more than {m.group(1)} parser items in one step{where}: it forces "
                f"text without end (a rule or schema that requires itself) or too much at once")
    return None
