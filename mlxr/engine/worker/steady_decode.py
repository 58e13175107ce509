"""The steady state of overlapped decoding: the same sequences as the last step, in the same
order, each one token further on, each on the token the last step sampled (still on the
device). The runner then advances the last step's index arrays instead of rebuilding them
row by row: a few list comprehensions and numpy operations instead of ~20 Python operations
a row (bench/probes/host_phases.py, at batch 256)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlxr.engine.records import SchedulerOutput


@dataclass
class DecodeArrays:
    """One decode step's index arrays (int64), one row a request, in schedule order."""

    request_ids: list[str]
    positions: np.ndarray  # [n] position of the token each row computes
    slots: np.ndarray  # [n] its cache slot
    tables: np.ndarray  # [n, width] block tables, padded with 0
    fill_from: list[int]  # row of the last step's sampled tokens that holds each row's token


class SteadyDecode:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.last: DecodeArrays | None = None

    def remember(self, out: SchedulerOutput, tables: list[int], width: int) -> None:
        """Keep a just-built all-decode step's arrays (positions and tables) for the next."""
        positions = np.array(out.num_computed_tokens, dtype=np.int64)
        n = len(out.request_ids)
        self.last = DecodeArrays(list(out.request_ids), positions, positions,
                                 np.array(tables, dtype=np.int64).reshape(n, width), [])

    def forget(self) -> None:
        self.last = None

    def advance(self, out: SchedulerOutput, states: dict, pending_rows: dict[str, int]) -> DecodeArrays | None:
        """This step's arrays if it is the last one advanced by a token, each row on the token
        the last step sampled; else None (the caller builds them row by row). Only each row's
        current block is read again: the blocks before it never change while a request keeps
        running (copy-on-write replaces the block a token is about to be written into, which
        is the current one)."""
        last = self.last
        if (last is None or out.request_ids != last.request_ids or out.blocks_to_swap_in
                or out.new_requests or len(out.num_scheduled_tokens) != sum(out.num_scheduled_tokens)):
            return None  # (a swapped-in request has all new blocks, not only its current one)
        positions = np.array(out.num_computed_tokens, dtype=np.int64)
        if not np.array_equal(positions, last.positions + 1):
            return None
        rows = [states[rid] for rid in last.request_ids]
        if [len(s.token_ids) for s in rows] != out.num_computed_tokens:
            return None  # not every row's token is the one in flight
        fill_from = [pending_rows.get(rid, -1) for rid in last.request_ids]
        if -1 in fill_from:
            return None
        block_idx = positions // self.block_size
        tables = last.tables
        width = int(block_idx.max()) + 1
        if width > tables.shape[1]:  # a request entered a block past the table's width
            tables = np.pad(tables, ((0, 0), (0, width - tables.shape[1])))
        try:
            current = np.array([s.block_table[b] for s, b in zip(rows, block_idx.tolist())], dtype=np.int64)
        except IndexError:  # not expected: the scheduler allocated the block; rebuild to be safe
            return None
        tables[np.arange(len(rows)), block_idx] = current
        slots = current * self.block_size + positions % self.block_size
        self.last = DecodeArrays(last.request_ids, positions, slots, tables, fill_from)
        return self.last
