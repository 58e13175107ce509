"""The reply's bound when a request sets none (no max_tokens, max_completion_tokens,
max_output_tokens or num_predict): `mlxr serve --max-tokens-default N`, or what is left of the
context when that is less. Without it a base model asked a plain prompt writes until the
context is full. 0 turns the bound off (a reply may then fill the context)."""
from __future__ import annotations

from fastapi import Request

DEFAULT_MAX_TOKENS = 2048


def default_max_tokens(request: Request) -> int:
    """The server's --max-tokens-default (0: none)."""
    return getattr(request.app.state, "max_tokens_default", DEFAULT_MAX_TOKENS)


def reply_budget(request: Request, asked: int | None, longest_prompt: int, context: int) -> int | None:
    """`asked` when the request set it; else the default, at most the context's remainder.
    None where there is no bound, or no room (the routes' own checks name that error)."""
    if asked is not None:
        return asked
    default, room = default_max_tokens(request), context - longest_prompt
    if default <= 0 or room <= 0:
        return None
    return min(default, room)
