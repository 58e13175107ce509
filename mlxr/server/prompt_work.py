"""Work whose cost a request decides (chat template rendering, tokenizing) runs here, off the
event loop and apart from the default executor: a burst of heavy prompts then delays other
prompts only, never /health, streams, or the routes that read the registry in threads."""
from __future__ import annotations

import asyncio
import contextvars
import functools
import os
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


# Every rendered prompt (a chat template's, an Ollama template's, a raw prompt) of more characters
# is refused before tokenizing, whatever the context: ~4 characters a token fill a 1M-token
# context. Env MLXR_MAX_PROMPT_CHARS. Tokenizing 7.8 MB took 25 s and gigabytes.
MAX_PROMPT_CHARS = 4 << 20


def prompt_chars_cap() -> int:
    raw = os.environ.get("MLXR_MAX_PROMPT_CHARS", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else MAX_PROMPT_CHARS


def max_prompt_chars(tokenizer: Any, context_length: int) -> int:
    """More characters than this cannot fit in `context_length` tokens: no token covers more
    text than its vocabulary piece spells (byte-level pieces spell each byte as one character);
    and never more than MAX_PROMPT_CHARS."""
    longest = _LONGEST_PIECE.get(tokenizer)
    if longest is None:
        longest = max((len(tokenizer.id_to_token(i)) for i in range(tokenizer.vocab_size)), default=1)
        _LONGEST_PIECE[tokenizer] = longest
    return min(context_length * max(longest, 1) * _NORMALIZATION_SLACK, prompt_chars_cap())


def check_prompt_chars(tokenizer: Any, context_length: int, text: str, param: str) -> None:
    """Refuse a text too long for the context before spending seconds tokenizing it."""
    limit = max_prompt_chars(tokenizer, context_length)
    if len(text) > limit:
        raise InvalidParameterError(
            param, f"is {len(text)} characters, more than a context of {context_length} tokens can hold "
                   f"with this tokenizer (at most {limit} characters; MAX_PROMPT_CHARS {prompt_chars_cap()})")
