"""The budget a chat template renders under: time, loop iterations, and the size of every
value it builds, checked BEFORE an operation whose result size its arguments decide (a `%`
format with a width of 10**9, `**`, `join`, `replace`), since checking afterwards is too late.

The deadline alone is not enough: it is only looked at between operations, and one operation
(a nested loop without calls, a huge power, a 1 GB format) can run for ever or fill memory.
"""
from __future__ import annotations

import re
import string
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from mlxr.errors import TemplateError

MAX_OUTPUT_CHARS = 1_000_000  # rendered prompt, and any string or list built on the way
MAX_BUILT_TOTAL = 50_000_000  # characters/items of all values built in one render (memory)
MAX_RANGE = 100_000  # one range() call
MAX_RANGE_TOTAL = 1_000_000  # all range() items of one render
MAX_LOOP_ITERATIONS = 1_000_000  # every {% for %} iteration of one render, filtered ones too
MAX_INT_BITS = 100_000  # integers a template computes (about 30,000 digits)
MAX_SECONDS = 5.0


@dataclass
class Budget:
    deadline: float
    range_left: int = MAX_RANGE_TOTAL
    loops_left: int = MAX_LOOP_ITERATIONS
    built_left: int = MAX_BUILT_TOTAL

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateError(f"chat template took longer than {MAX_SECONDS:g} s to render")

    def tick(self) -> None:
        self.loops_left -= 1
        if self.loops_left < 0:
            raise TemplateError(f"chat template loops ran more than {MAX_LOOP_ITERATIONS} iterations")
        self.check_time()


BUDGET: ContextVar[Budget | None] = ContextVar("mlxr_template_budget", default=None)


def new_budget() -> Budget:
    return Budget(time.monotonic() + MAX_SECONDS)


def budget() -> Budget:
    current = BUDGET.get()
    # Outside ChatTemplate.render (not expected) each check gets a fresh, still bounded budget.
    return current if current is not None else new_budget()


def check_length(length: int, what: str) -> None:
    if length > MAX_OUTPUT_CHARS:
        raise TemplateError(f"chat template built a {what} longer than {MAX_OUTPUT_CHARS}")


def check_size(value: Any, what: str) -> Any:
    """After an operation: the value, and everything built so far, within the limits."""
    if isinstance(value, (str, list, tuple, dict)):
        check_length(len(value), what)
        current = budget()
        current.built_left -= len(value)
        if current.built_left < 0:
            raise TemplateError(f"chat template built more than {MAX_BUILT_TOTAL} characters in all")
    elif isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise TemplateError(f"chat template computed a number of more than {MAX_INT_BITS} bits")
    return value


def checked_loop(iterable: Iterable[Any]) -> Iterator[Any]:
    """Wraps the iterable of every {% for %} (see the environment's parser)."""
    current = budget()
    current.check_time()
    for item in iterable:
        current.tick()
        yield item


def check_binop(operator: str, left: Any, right: Any) -> None:
    if operator == "**" and _is_int(left) and _is_int(right) and right > 0:
        if abs(left) > 1 and max(abs(left).bit_length() - 1, 1) * right > MAX_INT_BITS:
            raise TemplateError(f"chat template raised a number to a power of more than {MAX_INT_BITS} bits")
    elif operator == "*":
        if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateError(f"chat template computed a number of more than {MAX_INT_BITS} bits")
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and _is_int(count):
                check_length(len(seq) * count, "repetition")
    elif operator == "%" and isinstance(left, str):
        check_percent_format(left, right)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# A printf conversion: mapping key, flags, width, precision (the numbers are what we check).
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")


def check_percent_format(template: str, args: Any) -> None:
    """`'%01000000000d' % 1` builds 1 GB in one C call: check widths first."""
    for spec in _PERCENT_SPEC.finditer(template):
        for number in spec.groups():
            if number and number.isdigit():
                check_length(int(number), "formatted field")
    _check_int_args(args if isinstance(args, (tuple, list)) else (args,))


def check_brace_format(template: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """str.format: the same for "{:01000000000d}", and nested "{:{w}}" widths from arguments."""
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError:
        return  # the call itself will fail with a clear error
    for _, _, spec, _ in fields:
        for number in re.findall(r"\d+", spec or ""):
            check_length(int(number), "formatted field")
    _check_int_args((*args, *kwargs.values()))


def _check_int_args(values: Iterable[Any]) -> None:
    for value in values:
        if _is_int(value):
            check_length(abs(value), "formatted field")


# Methods and filters whose result size their arguments decide, checked before they run.
_SIZING = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "wordwrap", "truncate", "batch", "slice"})


def check_call(name: str, target: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Before a method (`name`, bound to `target`) or a filter (`|name`, on `target`) runs."""
    base = name.removeprefix("|")
    if base in _SIZING:
        _check_int_args((*args, *kwargs.values()))
    elif name == "join" and isinstance(target, str):
        _check_join(target, args[0] if args else ())
    elif name == "|join":
        _check_join(args[0] if args else kwargs.get("d", ""), target)
    elif base == "replace" and isinstance(target, str) and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        count = target.count(old) if old else len(target) + 1
        check_length(len(target) + count * max(len(new) - len(old), 0), "replace result")
    elif name == "|indent" and isinstance(target, str):
        _check_indent(target, args[0] if args else kwargs.get("width", 4))
    elif name == "|format" and isinstance(target, str):
        check_percent_format(target, (*args, *kwargs.values()))


def _check_join(sep: Any, items: Any) -> None:
    if not isinstance(items, (list, tuple)):
        return  # a string or generator: its parts are at most as long as its source
    total = len(str(sep)) * max(len(items) - 1, 0)
    for item in items:
        total += len(item) if isinstance(item, str) else 32
        check_length(total, "joined string")


def _check_indent(text: str, width: Any) -> None:
    width = len(width) if isinstance(width, str) else width
    if _is_int(width):
        check_length(len(text) + (text.count("\n") + 1) * abs(width), "indented text")
