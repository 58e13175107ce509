"""Where a step's bitmask is filled: persistent host buffers (pinned when masks go to a CUDA
device), and a worker thread that fills a large batch's masks while the step thread goes on with
work that does not need them (scheduling the next step, the sampler's per-row draws).

llguidance computes masks with the GIL released, in one call for a whole batch (MaskFiller's
one-call fills), so the worker holds the GIL only to enter and leave that call."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

MIN_ROWS = 8  # the smallest buffer (rows); a larger batch doubles it


class MaskBuffers:
    """Two [rows, words] int32 host buffers used in turn, kept across steps. A mask is filled
    in one while the other's copy to the device may still be queued; by the time a buffer
    comes round again, the step that used it has landed, and landing waits for that step's
    sampling, which the copy precedes."""

    def __init__(self, words: int, pin: bool) -> None:
        self.words, self._pin = words, pin
        self._buffers: list[torch.Tensor | None] = [None, None]
        self._turn = 0

    def take(self, rows: int) -> torch.Tensor:
        """The next buffer's first rows (contents left from an earlier step)."""
        self._turn ^= 1
        buf = self._buffers[self._turn]
        if buf is None or buf.shape[0] < rows:
            capacity = max(MIN_ROWS, 1 << (rows - 1).bit_length())
            with torch.inference_mode(False):  # a drafting step asks inside the runner's; a plain one outside
                buf = torch.empty((capacity, self.words), dtype=torch.int32, pin_memory=self._pin)
            self._buffers[self._turn] = buf
        return buf[:rows]


class PendingMask:
    """A step's bitmask being filled on the worker: calling it waits for the mask."""

    __slots__ = ("_future", "_mask", "_waited")

    def __init__(self, future: Future, mask: torch.Tensor, waited: Callable[[float], None]) -> None:
        self._future, self._mask, self._waited = future, mask, waited

    def __call__(self) -> torch.Tensor:
        start = time.perf_counter()
        self._future.result()  # re-raises the fill's error
        self._waited(time.perf_counter() - start)
        return self._mask


class FillThread:
    """One worker thread that runs fills handed to it."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="mlxr-mask")

    def start(self, fill: Callable[[], None]) -> Future:
        begun = threading.Event()

        def run() -> None:
            begun.set()
            fill()

        future = self._pool.submit(run)
        # Wait until the worker runs (it holds the GIL for a few lines, then releases it inside
        # llguidance): otherwise it may wait for the GIL until the step thread next drops it.
        begun.wait()
        return future

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)
