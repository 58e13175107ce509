"""Where disk blocks wait on their way into the device cache (kv/tiers.py): rows of one tensor
(pinned on CUDA, written at start on CPU, so the first restore pays no page faults), each read
into by the disk tier's threads, taken in order and all freed by the flush that copies them out.
And the one-thread region the tiers' CPU copies run in."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StagedRow:
    """A disk block, verified, in row `index` of the staging rows, on its way to the device cache."""

    index: int


class StagingRows:
    def __init__(self, rows: int, block_shape: tuple[int, ...], dtype: torch.dtype, cuda: bool) -> None:
        self.data = torch.zeros((rows, *block_shape), dtype=dtype, pin_memory=cuda)
        self._bytes = memoryview(self.data.view(-1).view(torch.uint8).numpy())
        self.block_bytes = len(self._bytes) // rows
        self._copied = torch.cuda.Event() if cuda else None
        self.taken = 0  # rows [0, taken) hold blocks read (or being read) since the last release
        self._in_flight = False  # the copies out of the rows queued at the last release may not have ended

    def free(self) -> int:
        return self.data.shape[0] - self.taken

    def take(self) -> int:
        if self._in_flight:  # rarely not ended by the time a new block is read
            self._copied.synchronize()
            self._in_flight = False
        self.taken += 1
        return self.taken - 1

    def buffer(self, row: int) -> memoryview:
        return self._bytes[row * self.block_bytes : (row + 1) * self.block_bytes]

    def release(self, stream: torch.cuda.Stream | None) -> None:
        """Every row is free again once the copies queued on stream (CUDA) have read them."""
        if self.taken and self._copied is not None:
            self._copied.record(stream)
            self._in_flight = True
        self.taken = 0


@contextlib.contextmanager
def one_thread():
    """CPU copies on the calling thread alone. They are bound by memory, which one core nearly
    saturates, and split across OpenMP threads each waits for the slowest: on a 2-core host with
    one core kept busy, a 186 MB restore took 109 ms on 2 threads, 17 ms on 1
    (bench/probes/kv_restore_phases.py --busy 1). The engine runs its torch ops on this thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
