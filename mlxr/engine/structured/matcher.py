"""One request's grammar state: an llguidance matcher that the scheduler advances by the tokens
it lands (never by tokens still in flight), so preemption leaves it right: a preempted request
keeps its landed tokens. No torch here: the scheduler calls it."""
from __future__ import annotations

import llguidance


class GrammarState:
    __slots__ = ("matcher", "num_tokens")

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher
        self.num_tokens = 0  # landed tokens it has taken (rollback counts in these)

    def advance(self, token: int) -> str | None:
        """Take a landed token: "stop" when the grammar is complete (nothing but EOS may follow),
        "error" when it did not allow the token, else None. EOS itself ends the request before
        it gets here."""
        if not self.matcher.consume_token(token):
            return "error"
        self.num_tokens += 1
        return "stop" if self.matcher.is_stopped() else None

    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens taken (rejected speculative tokens)."""
        if num_tokens:
            self.matcher.rollback(num_tokens)
            self.num_tokens -= num_tokens

    @property
    def error(self) -> str:
        return self.matcher.get_error() if self.matcher.is_error() else ""

    @property
    def done(self) -> bool:
        return self.matcher.is_stopped() or self.matcher.is_error()
