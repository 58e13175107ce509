"""One request's grammar state: an llguidance matcher that the scheduler advances by the tokens
it lands (never by tokens still in flight), so preemption leaves it right: a preempted request
keeps its landed tokens. A step's landed tokens go to their matchers in one batch (advance_all),
on llguidance's executor threads when this host runs that faster. No torch here: the scheduler
calls it."""
from __future__ import annotations

import logging
import os
import threading
import time

import llguidance

from mlxr.engine.structured.chooser import KindChooser

log = logging.getLogger(__name__)

THREADS_ENV = "MLXR_GRAMMAR_THREADS"  # the executor's threads (unset: llguidance's 80% of the CPUs, <= 32)
MAX_THREADS = 64
_shared: dict[str, object] = {}
_shared_lock = threading.Lock()


def threads_from_env() -> int | None:
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        log.warning("%s=%r is not a positive integer: llguidance's default is used", THREADS_ENV, value)
        return None
    return min(int(value), MAX_THREADS)


def executor() -> llguidance.LLExecutor:
    """The process's llguidance executor (its threads fill masks and take landed tokens)."""
    with _shared_lock:
        if "executor" not in _shared:
            _shared["executor"] = llguidance.LLExecutor(num_threads=threads_from_env())
            _shared["chooser"] = KindChooser()
        return _shared["executor"]


def advance_all(landed: list[tuple["GrammarState", int]]) -> list[str | None]:
    """GrammarState.advance for each (state, token), in one batch: the same results in order."""
    pool = executor()
    chooser: KindChooser = _shared["chooser"]
    kind = chooser.choose(len(landed))
    start = time.perf_counter()
    if kind == "serial":
        results = [state.advance(token) for state, token in landed]
    else:
        taken = pool.consume_token_par([(state.matcher, token) for state, token in landed])
        results = [state.after_consume(ok) for (state, _), ok in zip(landed, taken)]
    chooser.learn(kind, len(landed), time.perf_counter() - start)
    return results


class GrammarState:
    __slots__ = ("matcher", "num_tokens")

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher
        self.num_tokens = 0  # landed tokens it has taken (rollback counts in these)

    def advance(self, token: int) -> str | None:
        """Take a landed token: "stop" when the grammar is complete (nothing but EOS may follow),
        "error" when it did not allow the token, else None. EOS itself ends the request before
        it gets here."""
        return self.after_consume(self.matcher.consume_token(token))

    def after_consume(self, ok: bool) -> str | None:
        """advance's result once the matcher has taken (ok) or refused the token."""
        if not ok:
            return "error"
        self.num_tokens += 1
        return "stop" if self.matcher.is_stopped() else None

    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens taken (rejected speculative tokens)."""
        if num_tokens:
            self.matcher.rollback(num_tokens)
            self.num_tokens -= num_tokens

    def forced_tokens(self) -> list[int]:
        """The tokens the grammar forces next (llguidance's fast-forward: its fixed text, e.g. a
        schema's next key, tokenized the canonical way); [] when the next token is a choice."""
        return [] if self.done else list(self.matcher.compute_ff_tokens())

    @property
    def error(self) -> str:
        return self.matcher.get_error() if self.matcher.is_error() else ""

    @property
    def done(self) -> bool:
        return self.matcher.is_stopped() or self.matcher.is_error()
