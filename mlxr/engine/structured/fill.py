"""Filling a step's packed token bitmask from the rows' matchers, in this thread or on
llguidance's executor threads, whichever this host runs faster.

Which is faster is a property of the host, not of the code: the executor's threads sleep between
steps and must be woken and scheduled, which costs little on an idle many-core host and a time
slice on a loaded one (or one where PyTorch's OpenMP workers still spin after a CPU op), while
this thread is already running. So both are timed: each is tried in turn for the first few
large fills and again every RETRY fills, and the one with the lower recent time a row is used
in between. The mask is the same either way."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

PARALLEL_ROWS = 8  # below this many constrained rows, this thread always (waking threads costs more)
TRIALS = 4  # large fills of each kind before choosing
RETRY = 64  # a large fill of the kind not in use every RETRY fills, so a change of load is noticed
SMOOTHING = 0.25  # weight of the newest time in a kind's running figure


@dataclass
class FillTiming:
    """Host time spent filling masks (the bench reports it): in all, and per kind of fill."""

    seconds: float = 0.0
    rows: int = 0
    by_kind: dict[str, list[float]] = field(default_factory=lambda: {"serial": [0.0, 0], "parallel": [0.0, 0]})

    def add(self, kind: str, seconds: float, rows: int) -> None:
        self.seconds += seconds
        self.rows += rows
        spent = self.by_kind[kind]
        spent[0] += seconds
        spent[1] += rows

    def snapshot(self) -> dict:
        return {"seconds": self.seconds, "rows": self.rows, "by_kind": {k: list(v) for k, v in self.by_kind.items()}}

    def since(self, before: dict) -> dict:
        """Rows filled and microseconds a row since snapshot() gave before, in all and per kind."""
        def us(seconds: float, rows: int) -> float | None:
            return 1e6 * seconds / rows if rows else None

        kinds = {}
        for kind, (seconds, rows) in self.by_kind.items():
            s0, r0 = before["by_kind"][kind]
            kinds[kind] = {"rows": rows - r0, "us_per_row": us(seconds - s0, rows - r0)}
        rows = self.rows - before["rows"]
        return {"rows": rows, "us_per_row": us(self.seconds - before["seconds"], rows), "by_kind": kinds}


class MaskFiller:
    def __init__(self, executor) -> None:
        self._executor = executor  # llguidance.LLExecutor
        self._us_per_row: dict[str, float | None] = {"serial": None, "parallel": None}
        self._large_fills = 0
        self.timing = FillTiming()

    def fill(self, matchers: list[tuple[object, int]], mask: torch.Tensor) -> None:
        """mask[i] = matcher's allowed tokens for each (matcher, i)."""
        import llguidance.torch as llg_torch

        kind = self._choose(len(matchers))
        start = time.perf_counter()
        if kind == "parallel":
            llg_torch.fill_next_token_bitmask_par(self._executor, matchers, mask)
        else:
            for matcher, i in matchers:
                llg_torch.fill_next_token_bitmask(matcher, mask, i)
        seconds = time.perf_counter() - start
        self.timing.add(kind, seconds, len(matchers))
        if len(matchers) >= PARALLEL_ROWS:
            self._learn(kind, 1e6 * seconds / len(matchers))

    def _choose(self, rows: int) -> str:
        if rows < PARALLEL_ROWS:
            return "serial"
        self._large_fills += 1
        n, us = self._large_fills, self._us_per_row
        if n <= 2 * TRIALS:
            return "parallel" if n % 2 else "serial"
        best = "parallel" if us["parallel"] <= us["serial"] else "serial"
        if n % RETRY == 0:
            return "serial" if best == "parallel" else "parallel"
        return best

    def _learn(self, kind: str, us_per_row: float) -> None:
        old = self._us_per_row[kind]
        self._us_per_row[kind] = us_per_row if old is None else (1 - SMOOTHING) * old + SMOOTHING * us_per_row

    @property
    def us_per_row(self) -> dict[str, float | None]:
        """Each kind's running time a row (None until tried)."""
        return dict(self._us_per_row)
