"""Counts the Triton kernels compiled (or loaded from the disk cache) in this process, and
those after the engine declared itself warm: each of these cost a request a pause, so it
is logged as a warning and exported as mlxr:runtime_compiles_total."""
from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class CompileWatch:
    def __init__(self) -> None:
        self.total = 0
        self.after_warm_up = 0
        self.warm = False
        self.installed = False
        self._lock = threading.Lock()

    def install(self) -> None:
        """Chain a post-compile hook into Triton's runtime knobs (no-op without Triton)."""
        if self.installed:
            return
        try:
            from triton import knobs
        except ImportError:
            return
        previous = knobs.runtime.jit_post_compile_hook

        def hook(*args, **kwargs):
            self._count(kwargs.get("repr", "a kernel"))
            return previous(*args, **kwargs) if previous is not None else None

        knobs.runtime.jit_post_compile_hook = hook
        self.installed = True

    def _count(self, what: str) -> None:
        with self._lock:
            self.total += 1
            if self.warm:
                self.after_warm_up += 1
                log.warning("compiled %s while serving (the warm-up missed this variant)", what[:400])

    def warming(self) -> None:
        """An engine's warm-up starts: its compiles are expected (another engine of this process
        may have been warm already)."""
        self.warm = False

    def mark_warm(self) -> None:
        self.warm = True


WATCH = CompileWatch()
