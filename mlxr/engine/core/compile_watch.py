"""Counts the Triton kernels compiled (or loaded from the disk cache) in this process, and
those after the engine declared itself warm: each of these cost a request a pause, so it
is logged as a warning and exported as mlxr:runtime_compiles_total. It also sums the seconds
spent compiling (graph capture's time budget leaves them out) and points Triton's disk cache at
a stable, versioned folder (`kernel_cache_dir`), so a restart loads what the last start built."""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from mlxr.engine.worker import graph_pool

log = logging.getLogger(__name__)


def kernel_cache_dir() -> Path:
    """$MLXR_CACHE_DIR/triton/<Triton's version>: Triton's own keys add the device, the kernel's
    source and its specialisation, so one folder serves every model and GPU of a host."""
    import triton

    root = Path(os.environ.get("MLXR_CACHE_DIR") or Path.home() / ".cache" / "mlxr").expanduser()
    return root / "triton" / triton.__version__


def use_kernel_cache() -> None:
    """Triton's disk cache in kernel_cache_dir(), unless TRITON_CACHE_DIR chose one already."""
    if not os.environ.get("TRITON_CACHE_DIR"):
        path = kernel_cache_dir()
        path.mkdir(parents=True, exist_ok=True)
        os.environ["TRITON_CACHE_DIR"] = str(path)


class CompileWatch:
    def __init__(self) -> None:
        self.total = 0
        self.after_warm_up = 0
        self.seconds = 0.0  # spent in Triton's compiler (or its disk cache), every thread together
        self.warm = False
        self.installed = False
        self._lock = threading.Lock()
        self._started = threading.local()

    def install(self) -> None:
        """Chain hooks before and after each compile into Triton's runtime knobs (no-op without
        Triton), and choose its disk cache."""
        if self.installed:
            return
        try:
            from triton import knobs
        except ImportError:
            return
        use_kernel_cache()
        before, after = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook

        def starting(*args, **kwargs):
            self._started.t = time.perf_counter()
            return before(*args, **kwargs) if before is not None else False  # True would skip the compile

        def hook(*args, **kwargs):
            self._count(kwargs.get("repr", "a kernel"), time.perf_counter() - getattr(self._started, "t", time.perf_counter()))
            return after(*args, **kwargs) if after is not None else None

        knobs.runtime.jit_cache_hook = starting
        knobs.runtime.jit_post_compile_hook = hook
        graph_pool.compile_seconds = lambda: self.seconds
        self.installed = True

    def _count(self, what: str, seconds: float = 0.0) -> None:
        with self._lock:
            self.total += 1
            self.seconds += seconds
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
