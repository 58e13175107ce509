"""Ollama's answer to a prompt longer than the context (num_ctx): cut it to fit, with a log
line, unless the request says `truncate: false`, which is a 400 naming both numbers (the OpenAI
routes always answer 400). A chat drops its oldest messages first, keeping the system messages
and the latest message; what still does not fit, and a generate prompt, keeps its first
num_keep tokens and its end.

The cut leaves room for the reply: num_predict tokens, at most half the window (a quarter when
num_predict is unset), because there is no context shift to make room later."""
from __future__ import annotations

import logging
from typing import Any

from mlxr.server.ollama.options import Options
from mlxr.server.ollama.prompts import chat_prompt_ids
from mlxr.server.ollama.schemas import ChatRequest

log = logging.getLogger(__name__)
DEFAULT_NUM_KEEP = 4  # Ollama's default for options.num_keep


def prompt_limit(options: Options | None, window: int) -> int:
    """The longest prompt kept: the window less the room for the reply (at least one token)."""
    wanted = options.num_predict if options and options.num_predict and options.num_predict > 0 else window // 4
    return max(1, window - max(1, min(wanted, window // 2)))


def keep_head_and_tail(ids: list[int], limit: int, num_keep: int | None) -> list[int]:
    keep = min(max(0, num_keep if num_keep is not None else DEFAULT_NUM_KEEP), limit // 2)
    return ids[:keep] + ids[len(ids) - (limit - keep):]


def fit_prompt(ids: list[int], options: Options | None, window: int) -> list[int]:
    limit = prompt_limit(options, window)
    cut = keep_head_and_tail(ids, limit, options.num_keep if options else None)
    log.info("prompt of %d tokens truncated to %d (context %d)", len(ids), len(cut), window)
    return cut


def fit_chat(req: ChatRequest, tokenizer: Any, options: Options | None, window: int, context_length: int) -> list[int]:
    """Drops the fewest oldest non-system messages that make the prompt fit (binary search:
    the rendered length shrinks as more are dropped)."""
    limit = prompt_limit(options, window)
    droppable = [i for i, m in enumerate(req.messages[:-1]) if m.role != "system"]

    def render(n_dropped: int) -> list[int]:
        gone = set(droppable[:n_dropped])
        kept = [m for i, m in enumerate(req.messages) if i not in gone]
        return chat_prompt_ids(req.model_copy(update={"messages": kept}), tokenizer, context_length)

    lo, hi = 0, len(droppable)
    best = render(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        ids = render(mid)
        if len(ids) <= limit:
            hi, best = mid, ids
        else:
            lo = mid + 1
    if len(best) > limit:
        best = keep_head_and_tail(best, limit, options.num_keep if options else None)
    log.info("chat prompt truncated to %d tokens by dropping %d of %d messages (context %d)",
             len(best), lo, len(req.messages), window)
    return best
