"""/api/create and /api/pull of model files on the server machine (hub pulls: hub_pull.py).

`pull` takes an absolute path or a file:// URL here, `create` a path, an existing model name in
`from`, or blobs (blobs.py). Progress lines come from the registry hashing the file.
A client that disconnects stops the stream, not the import (a thread cannot be interrupted).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from mlxr.errors import InvalidParameterError, MLXRError, ModelFormatError, ModelNotFoundError

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
_PATH_PREFIXES = ("/", "./", "../", "~")


def local_path(ref: str, field: str) -> Path | None:
    """The path `ref` names (a file:// URL or a path-looking string), else None. Whether it
    exists is not said here: see unusable()."""
    if ref.startswith("file:"):
        url = urlparse(ref)
        if url.netloc not in ("", "localhost"):
            raise InvalidParameterError(field, f"file URL {ref!r} names another host")
        path = Path(unquote(url.path))
    elif ref.startswith(_PATH_PREFIXES) or ref.endswith(".gguf"):
        try:
            path = Path(ref).expanduser()
        except RuntimeError:  # "~nosuchuser/..."
            raise unusable(ref, field) from None
    else:
        return None
    if "\x00" in str(path):  # the OS refuses it deep in the import, as a ValueError (a 500)
        raise InvalidParameterError(field, "names a path holding a NUL character, which no path may hold")
    if not path.is_absolute():
        raise InvalidParameterError(field, f"{ref!r}: give an absolute path (the server's directory is not yours)")
    return path


def unusable(ref: str | Path, field: str) -> InvalidParameterError:
    """One answer for a path that does not exist, cannot be read, or is not a model: a
    client must not learn which files exist on the server (CVE-2024-39719)."""
    return InvalidParameterError(
        field, f"{str(ref)!r} is not a GGUF file or Hugging Face model directory that the server can read")


def pull_path(ref: str) -> Path:
    path = local_path(ref, "model")
    if path is None:
        raise ModelNotFoundError(
            f"model '{ref}' not found: pull only imports local files (an absolute path or a "
            "file:// URL to a GGUF file or Hugging Face directory); there is no model hub", param="model")
    return path


async def import_steps(registry: Any, path: Path, name: str | None, field: str,
                       settings: Any = None, projector: Path | None = None) -> AsyncIterator[dict[str, Any]]:
    """Progress objects while the registry imports `path` (after the loader's preflight), then
    {"status": "success"}. A projector (an mmproj file) comes from the client's blobs, so what is
    wrong with it is said: it tells nothing about the server's files."""
    from mlxr.loader.preflight import check_loadable

    label = f"importing {path.name}"
    record = None

    def run(progress: Progress) -> Any:
        try:
            return registry.import_model(path, name=name, progress=progress, settings=settings,
                                         check=check_loadable, projector=projector)
        except ModelFormatError as e:
            if projector is not None:
                raise InvalidParameterError(field, f"the model and its projector do not load: {e.message}") from None
            log.info("import of %s refused: %s", path, e)
            raise unusable(path, field) from None
        except OSError as e:  # the detail would say the file exists
            log.info("import of %s refused: %s", path, e)
            raise unusable(path, field) from None
        except InvalidParameterError as e:
            if e.param == "path":  # missing, unreadable, or neither kind of model
                raise unusable(path, field) from None
            raise

    async for item in _with_progress(run):
        if isinstance(item, tuple):
            yield {"status": label, "total": item[1], "completed": item[0]}
        else:
            record = item
    yield {"status": label, "digest": record.digest, "total": record.size_bytes, "completed": record.size_bytes}
    yield {"status": f"writing manifest for {record.name}"}
    yield {"status": "success"}


async def copy_steps(registry: Any, source: str, name: str, settings: Any = None) -> AsyncIterator[dict[str, Any]]:
    yield {"status": f"using existing model {source}"}
    await asyncio.to_thread(registry.copy, source, name, settings)
    yield {"status": "writing manifest"}
    yield {"status": "success"}


async def collect(steps: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    """Non-streaming: run every step; the last one is the answer."""
    last: dict[str, Any] = {}
    async for last in steps:
        pass
    return last


async def error_lines(steps: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    """Streaming: an error after the first line can only travel as an {"error"} line."""
    try:
        async for step in steps:
            yield step
    except MLXRError as e:
        yield {"error": e.message}
    except OSError as e:
        yield {"error": f"cannot read the model files: {e}"}


async def _with_progress(run: Callable[[Progress], Any]) -> AsyncIterator[tuple[int, int] | Any]:
    """Run `run(progress)` in a thread; yield (done, total) as reported, then its result."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    last = [-1]

    def progress(done: int, total: int) -> None:
        percent = done * 100 // total if total else 100
        if percent != last[0] or done == total:  # at most ~100 lines per file
            last[0] = percent
            loop.call_soon_threadsafe(queue.put_nowait, (done, total))

    task = asyncio.ensure_future(asyncio.to_thread(run, progress))
    while not task.done():
        getter = asyncio.ensure_future(queue.get())
        try:
            await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await getter
        if not getter.cancelled():
            yield getter.result()
    await asyncio.sleep(0)  # let progress calls scheduled just before the end arrive
    while not queue.empty():
        yield queue.get_nowait()
    yield task.result()
