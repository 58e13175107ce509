"""How far a regex's counted repetitions nest, before llguidance sees it.

llguidance's lexer is lazy (regex derivatives), so what is exponential for a backtracking
engine, `(a|aa)*b` or `(x+x+)+y`, costs it microseconds a token. What does cost it is counted
repetition nested in counted repetition: `(a{100}){1000}` is a{100000} with every split point
kept apart, ~0.2 s a token mask on a 49k vocabulary, and `a{1000}{1000}` spends its whole lexer
fuel (~1 s) on the first mask before failing. A repetition count of its own is cheap
(`[a-z]{1,100000}`); the product of nested counts is what is bounded."""
from __future__ import annotations

import re
from collections.abc import Iterator

MAX_REPEAT_PRODUCT = 10_000  # (a{100}){100}: ~10 ms a mask at worst on a 49k vocabulary
_COUNT = re.compile(r"\{(\d{1,9})(?:,(\d{0,9}))?\}")
_BRACED_ESCAPES = "pPxuN"  # \p{L}, \x{263a}, \u{...}, \N{...}: their braces are not counts


def repeat_product(regex: str) -> int:
    """The largest product of counted repetitions ({n}, {n,m}, {n,}: its larger bound) nested two
    or more deep in regex, 1 if none. A scan of the text (groups, classes, escapes), not a full
    parser. Weights are (product, levels) of the atom a quantifier would apply to."""
    frames = [(1, 0)]  # per open group: its heaviest atom
    last: tuple[int, int] | None = None
    worst, i, n = 1, 0, len(regex)
    while i < n:
        c = regex[i]
        if c == "\\":
            i, last = _skip_escape(regex, i), (1, 0)
        elif c == "[":
            i, last = _skip_class(regex, i), (1, 0)
        elif c == "(":
            frames.append((1, 0))
            last, i = None, i + 1
        elif c == ")":
            last, i = (frames.pop() if len(frames) > 1 else (1, 0)), i + 1
        elif c == "|":
            last, i = None, i + 1
        elif c == "{" and last is not None and (m := _COUNT.match(regex, i)):
            low, high = int(m.group(1)), m.group(2)
            last = (min(last[0] * max(1, int(high) if high else low), 10 ** 12), last[1] + 1)
            if last[1] >= 2:
                worst = max(worst, last[0])
            i = m.end()
        else:
            if c not in "*+?":
                last = (1, 0)
            i += 1
        if last is not None and last > frames[-1]:
            frames[-1] = last
    return worst


def _skip_escape(regex: str, i: int) -> int:
    if i + 1 < len(regex) and regex[i + 1] in _BRACED_ESCAPES and regex.startswith("{", i + 2):
        end = regex.find("}", i + 3)
        return len(regex) if end < 0 else end + 1
    return i + 2


def _skip_class(regex: str, i: int) -> int:
    """Past the ']' that closes the class opened at i (nested [:alpha:] and [[a-z]] classes)."""
    depth, i = 1, i + 1
    if i < len(regex) and regex[i] == "^":
        i += 1
    if i < len(regex) and regex[i] == "]":
        i += 1
    while i < len(regex) and depth:
        c = regex[i]
        if c == "\\":
            i += 2
            continue
        depth += 1 if c == "[" else -1 if c == "]" else 0
        i += 1
    return i


def check_regex(what: str, regex: str) -> str | None:
    """Why regex is refused, or None."""
    product = repeat_product(regex)
    if product > MAX_REPEAT_PRODUCT:
        return f"{what} nests counted repetitions to {product} repeats (at most {MAX_REPEAT_PRODUCT})"
    return None


LARK_REGEX = re.compile(r"/((?:\\.|[^/\\\n])+)/[imslux]*")


def lark_regexes(grammar: str) -> list[str]:
    """The /regex/ literals of a Lark grammar."""
    return [m.group(1) for m in LARK_REGEX.finditer(grammar)]


def schema_objects(doc: object) -> Iterator[dict]:
    """Every JSON object in a parsed JSON document, without recursion."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (dict, list)))


def schema_patterns(doc: object) -> list[str]:
    """Every "pattern" and "patternProperties" regex in a parsed JSON schema."""
    found = []
    for node in schema_objects(doc):
        if isinstance(node.get("pattern"), str):
            found.append(node["pattern"])
        if isinstance(node.get("patternProperties"), dict):
            found.extend(node["patternProperties"])
    return found
