"""What landing sampled tokens does to one request, before the scheduler settles it (records the
output, commits its full blocks, finishes it): each token taken in order until one ends it (a
stop id, EOS, max_tokens, or its grammar), rejected drafts given back by counts. Pure Python."""
from __future__ import annotations

from mlxr.engine.sched.request import Request


def roll_back_rejected(req: Request, drafts: list[int] | None, sampled: list[int]) -> None:
    """Rejected drafts roll back by counts: their KV is simply overwritten later."""
    if drafts:
        rejected = len(drafts) + 1 - len(sampled)
        req.num_in_flight -= rejected
        req.num_computed_tokens -= rejected


def take_one(req: Request, token: int) -> str | None:
    """The token joins the request; the finish reason it causes (its grammar not asked)."""
    req.num_in_flight -= 1
    req.token_ids.append(token)
    return req.stop_reason_for(token)


def take_tokens(req: Request, tokens: list[int]) -> tuple[int, str | None]:
    """Tokens taken until one ends the request (its grammar asked too): (how many, the reason)."""
    taken, reason = 0, None
    for token in tokens:
        taken += 1
        reason = take_one(req, token)
        if req.grammar is not None and reason != "stop":  # a complete grammar ends it as "stop"
            reason = req.grammar.advance(token) or reason
        if reason is not None:
            break
    return taken, reason


def constrained_reasons(rows: list) -> list[str | None]:
    """rows: (request, tokens, logprobs, reason after take_one) of one-token constrained rows: the
    matchers of those their token did not stop take it in one batch; each row's final reason."""
    from mlxr.engine.structured import matcher

    advancing = [(req.grammar, tokens[0]) for req, tokens, _, reason in rows if reason != "stop"]
    results = iter(matcher.advance_all(advancing) if advancing else ())
    return [reason if reason == "stop" else (next(results) or reason) for _, _, _, reason in rows]
