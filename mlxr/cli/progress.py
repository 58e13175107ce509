"""rich progress on stderr, only when stderr is a terminal: piped output and logs stay plain."""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Update = Callable[[int, int], None]  # (done, total)


def on_terminal() -> bool:
    return sys.stderr.isatty()


def _console():
    from rich.console import Console

    return Console(stderr=True)


@contextmanager
def progress_bar(description: str, in_bytes: bool = False) -> Iterator[Update | None]:
    """Yields update(done, total) driving a bar that vanishes when done; None off a terminal."""
    if not on_terminal():
        yield None
        return
    from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                               TextColumn, TimeElapsedColumn)

    count = DownloadColumn() if in_bytes else MofNCompleteColumn()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), count, TimeElapsedColumn())
    with Progress(*columns, console=_console(), transient=True) as bar:
        task = bar.add_task(description, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@contextmanager
def spinner(description: str) -> Iterator[None]:
    if not on_terminal():
        yield
        return
    with _console().status(description):
        yield


def build_cpu_kernels(device: str | None) -> None:
    """Compile the C kernels now, under a spinner, rather than as a silent pause at the first
    request. Off a terminal they build on first use as before (with a log line)."""
    if not on_terminal() or (device or "cpu") != "cpu":
        return
    from mlxr.ops.cpu.cpu_build import load_library, unbuilt_libraries

    missing = unbuilt_libraries()
    for i, name in enumerate(missing, 1):
        with spinner(f"compiling CPU kernels ({i}/{len(missing)}: {name}.c, first use only)"):
            load_library(name)


def load_llm(model: str, ns, **engine_kwargs):
    """LLM(model) with the kernel build and the weight loading shown on a terminal."""
    from mlxr.cli.options import use_threads
    from mlxr.llm import LLM

    use_threads(ns)
    build_cpu_kernels(ns.device)
    with progress_bar(f"loading {model}") as update:
        # One user at a terminal: the engine core stays in this process (its threads, its
        # model for /show info), whatever the device.
        return LLM(model, dtype=ns.dtype, device=ns.device, quantization=ns.quantization,
                   load_progress=update, **{"engine_process": False, **engine_kwargs})
