"""Filling a step's packed token bitmask from the rows' matchers, in the calling thread or on
llguidance's executor threads, whichever this host runs faster (chooser.py). The mask is the
same either way."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from mlxr.engine.structured.chooser import PARALLEL_ROWS, TRIALS, KindChooser

__all__ = ["PARALLEL_ROWS", "TRIALS", "FillTiming", "MaskFiller"]


@dataclass
class FillTiming:
    """Host time spent filling masks (the bench reports it): in all, and per kind of fill;
    on_step_thread: fills the step thread ran itself; waited: the step thread's waits for fills
    on the worker (mask_job.py)."""

    seconds: float = 0.0
    rows: int = 0
    on_step_thread: float = 0.0
    waited: float = 0.0
    by_kind: dict[str, list[float]] = field(default_factory=lambda: {"serial": [0.0, 0], "parallel": [0.0, 0]})

    def add(self, kind: str, seconds: float, rows: int) -> None:
        self.seconds += seconds
        self.rows += rows
        spent = self.by_kind[kind]
        spent[0] += seconds
        spent[1] += rows

    def add_wait(self, seconds: float) -> None:
        self.waited += seconds

    def snapshot(self) -> dict:
        return {"seconds": self.seconds, "rows": self.rows, "on_step_thread": self.on_step_thread,
                "waited": self.waited, "by_kind": {k: list(v) for k, v in self.by_kind.items()}}

    def since(self, before: dict) -> dict:
        """Rows filled and microseconds a row since snapshot() gave before, in all and per kind."""
        def us(seconds: float, rows: int) -> float | None:
            return 1e6 * seconds / rows if rows else None

        kinds = {}
        for kind, (seconds, rows) in self.by_kind.items():
            s0, r0 = before["by_kind"][kind]
            kinds[kind] = {"rows": rows - r0, "us_per_row": us(seconds - s0, rows - r0)}
        rows = self.rows - before["rows"]
        step_thread = self.on_step_thread - before["on_step_thread"] + self.waited - before["waited"]
        return {"rows": rows, "us_per_row": us(self.seconds - before["seconds"], rows),
                "step_thread_us_per_row": us(step_thread, rows), "by_kind": kinds}


class MaskFiller:
    def __init__(self, executor, serial_executor=None) -> None:
        """executor: llguidance.LLExecutor; serial_executor: one of a single thread, for serial
        fills in one call (see fill; made here when not given)."""
        if serial_executor is None:
            import llguidance

            serial_executor = llguidance.LLExecutor(num_threads=1)
        self._executor, self._serial_executor = executor, serial_executor
        self._chooser = KindChooser()
        self.timing = FillTiming()

    def fill(self, matchers: list[tuple[object, int]], mask: torch.Tensor, off_step_thread: bool = False) -> None:
        """mask[i] = matcher's allowed tokens for each (matcher, i). A serial fill is one call
        too (the single-thread executor's): a worker thread that runs it takes the GIL once, not
        once a row (each time waiting for the step thread to drop it), and the step thread
        saves the per-row calls' overhead (batch 64 on a 2-core host: 445 us against 497 for
        the row loop; bench/probes/constrained_host.py, constrained_host-20261125T083450Z).
        off_step_thread: the fill runs off the step thread (its time is not the step thread's)."""
        import llguidance.torch as llg_torch

        self._run(llg_torch.fill_next_token_bitmask_par, matchers, mask, len(matchers), off_step_thread)

    def fill_with_drafts(self, jobs: list[tuple[object, int, list[int]]], mask: torch.Tensor) -> None:
        """For each (matcher, first row, drafts): mask[first + j] = the matcher's allowed tokens
        after taking drafts[:j], for j up to the first draft it refuses; the matcher is left as
        it was (llguidance takes the drafts and rolls them back). Rows past a refused draft are
        left as they were."""
        import llguidance.torch as llg_torch

        rows = sum(1 + len(d) for _, _, d in jobs)
        self._run(llg_torch.fill_next_token_bitmask_par_with_draft_tokens, jobs, mask, rows, False)

    def _run(self, fill, jobs: list, mask: torch.Tensor, rows: int, off_step_thread: bool) -> None:
        """fill(executor, jobs, mask) on the executor of the kind this host runs faster for
        rows mask rows, timed."""
        kind = self._chooser.choose(rows)
        start = time.perf_counter()
        fill(self._executor if kind == "parallel" else self._serial_executor, jobs, mask)
        seconds = time.perf_counter() - start
        self.timing.add(kind, seconds, rows)
        if not off_step_thread:
            self.timing.on_step_thread += seconds
        self._chooser.learn(kind, rows, seconds)

    @property
    def us_per_row(self) -> dict[str, float | None]:
        """Each kind's running time a row (None until tried)."""
        return self._chooser.us_per_row
