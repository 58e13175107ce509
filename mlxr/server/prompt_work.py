"""Work whose cost a request decides (chat template rendering, tokenizing) runs here, off the
event loop and apart from the default executor: a burst of heavy prompts then delays other
prompts only, never /health, streams, or the routes that read the registry in threads."""
from __future__ import annotations

import asyncio
import contextvars
import functools
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from mlxr.errors import InvalidParameterError

T = TypeVar("T")
# Threads share one GIL: more would not render faster, only hold more requests mid-render.
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mlxr-prompt")


async def off_loop(fn: Callable[..., T], *args: object) -> T:
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(_POOL, call)


# Unicode normalisation may fold a few code points into one before tokenizing ("s" and two
# combining dots become one character): the bound below allows for it.
_NORMALIZATION_SLACK = 4
_LONGEST_PIECE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def max_prompt_chars(tokenizer: Any, context_length: int) -> int:
    """More characters than this cannot fit in `context_length` tokens: no token covers more
    text than its vocabulary piece spells (byte-level pieces spell each byte as one character)."""
    longest = _LONGEST_PIECE.get(tokenizer)
    if longest is None:
        longest = max((len(tokenizer.id_to_token(i)) for i in range(tokenizer.vocab_size)), default=1)
        _LONGEST_PIECE[tokenizer] = longest
    return context_length * max(longest, 1) * _NORMALIZATION_SLACK


def check_prompt_chars(tokenizer: Any, context_length: int, text: str, param: str) -> None:
    """Refuse a text too long for the context before spending seconds tokenizing it."""
    limit = max_prompt_chars(tokenizer, context_length)
    if len(text) > limit:
        raise InvalidParameterError(
            param, f"is {len(text)} characters, more than a context of {context_length} tokens can hold "
                   f"with this tokenizer (at most {limit} characters)")
