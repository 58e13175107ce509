"""Work whose cost a request decides (chat template rendering, tokenizing) runs here, off the
event loop and apart from the default executor: a burst of heavy prompts then delays other
prompts only, never /health, streams, or the routes that read the registry in threads."""
from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
# Threads share one GIL: more would not render faster, only hold more requests mid-render.
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mlxr-prompt")


async def off_loop(fn: Callable[..., T], *args: object) -> T:
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(_POOL, call)
