"""How many drafts a step's rows take, from what drafting earned and what the step costs.

A drafting step of b rows carrying n drafts in all costs drafting_ms(b, n) on the device it was
measured on (a table written by bench/kernels/spec_cost_table.py: it includes landing the step
before, the overlap a drafting step gives up); a plain step costs plain_ms(b). Row r's drafts are
kept with probability a_r each, given the ones before it were (its measured acceptance; a new
request starts from everyone's), so its j-th draft adds a_r ** j expected tokens. The plan takes
the drafts with the largest gains first and keeps the count n that maximizes expected tokens per
millisecond, (b + gains) / drafting_ms(b, n); when none beats b / plain_ms(b), nothing drafts
(and the step keeps its overlap). Batches of 8-32 still draft where acceptance is high; low
acceptance or a compute-bound batch drafts nothing."""
from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

from mlxr.errors import InvalidParameterError

PRIOR_WEIGHT = 2.0  # a request's estimate starts as this many observations at everyone's rate
PROBE_EVERY = 64  # plans that drafted nothing in a row before one plans at the prior (acceptance can rise)
PROBE_ACCEPTANCE = 0.5


def _interp(xs: tuple[float, ...], ys: tuple[float, ...], x: float, below: bool = False) -> float:
    """Piecewise linear through (xs, ys); past the last point the last slope; below the first,
    the first slope if below, else flat."""
    if len(xs) == 1 or (x <= xs[0] and not below):
        return ys[0]
    i = min(max(1, bisect.bisect_left(xs, x)), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class StepCosts:
    """Step times on one device: plain_ms[i] for a plain decode step of batches[i] rows,
    drafting_ms[i][j] for one whose batches[i] rows each carry drafts[j] drafts."""

    batches: tuple[int, ...]
    drafts: tuple[int, ...]
    plain_ms: tuple[float, ...]
    drafting_ms: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        ok = (self.batches and list(self.batches) == sorted(set(self.batches)) and self.drafts
              and list(self.drafts) == sorted(set(self.drafts)) and len(self.plain_ms) == len(self.batches)
              and len(self.drafting_ms) == len(self.batches)
              and all(len(row) == len(self.drafts) for row in self.drafting_ms)
              and all(t > 0 for t in self.plain_ms) and all(t > 0 for row in self.drafting_ms for t in row))
        if not ok:
            raise InvalidParameterError("speculative cost table", "needs increasing batches and drafts, and a "
                                        "positive time for each plain batch and each (batch, drafts) pair")

    def plain(self, batch: int) -> float:
        return _interp(self.batches, self.plain_ms, batch)

    def drafting(self, batch: int, num_drafts: int) -> float:
        """Fewer drafts per row than the table's first column: along its first two columns'
        line, whose intercept is a drafting step's fixed cost (the landing), at least a plain step."""
        per_row = num_drafts / batch
        at_batch = tuple(max(plain, _interp(self.drafts, row, per_row, below=True))
                         for plain, row in zip(self.plain_ms, self.drafting_ms))
        return _interp(self.batches, at_batch, batch)

    @classmethod
    def from_json(cls, entry: dict) -> StepCosts:
        try:
            return cls(tuple(entry["batches"]), tuple(entry["drafts"]), tuple(map(float, entry["plain_ms"])),
                       tuple(tuple(map(float, row)) for row in entry["drafting_ms"]))
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidParameterError("speculative cost table", f"is malformed: {e}") from None


def load_costs(path: Path, device_name: str) -> StepCosts | None:
    """The table's entry for this device (its "devices" map, by device name), or None."""
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise InvalidParameterError("speculative cost table", f"{path} cannot be read: {e}") from None
    entry = table.get("devices", {}).get(device_name) if isinstance(table, dict) else None
    return None if entry is None else StepCosts.from_json(entry)


class DraftBudget:
    """The per-step plan, and the acceptance it plans from (fed by the speculator's observe)."""

    def __init__(self, costs: StepCosts) -> None:
        self.costs = costs
        self.kept: dict[str, float] = {}  # drafts kept, by request
        self.missed: dict[str, float] = {}  # drafts runs that ended in a rejection, by request
        self.total_kept, self.total_missed = 0.0, 0.0
        self._idle_plans = 0

    def observe(self, request_id: str, drafted: int, accepted: int) -> None:
        missed = float(accepted < drafted)
        self.kept[request_id] = self.kept.get(request_id, 0.0) + accepted
        self.missed[request_id] = self.missed.get(request_id, 0.0) + missed
        self.total_kept += accepted
        self.total_missed += missed

    def retain(self, request_ids: set[str]) -> None:
        for table in (self.kept, self.missed):
            for rid in [r for r in table if r not in request_ids]:
                del table[rid]

    def acceptance(self, request_id: str) -> float:
        """Each draft's chance to be kept given the ones before it were: kept / (kept + misses)
        (a geometric run's estimate), from PRIOR_WEIGHT observations at everyone's rate."""
        prior = (1.0 + self.total_kept) / (2.0 + self.total_kept + self.total_missed)
        kept, missed = self.kept.get(request_id, 0.0), self.missed.get(request_id, 0.0)
        return (PRIOR_WEIGHT * prior + kept) / (PRIOR_WEIGHT + kept + missed)

    def plan(self, batch: int, rows: list[tuple[str, int]], limit: float = float("inf"), count: bool = True) -> list[int]:
        """rows: (request id, drafts at most) of the rows that may draft in a step of batch rows;
        each one's drafts (limit in all), 0 for all when drafting would not beat a plain step.
        count: this plan is the step's own (not a look ahead), and counts towards the next probe."""
        probe = self._idle_plans >= PROBE_EVERY
        rates = [max(self.acceptance(rid), PROBE_ACCEPTANCE) if probe else self.acceptance(rid) for rid, _ in rows]
        counts = self.best_counts(batch, [(a, k) for a, (_, k) in zip(rates, rows)], limit)
        if count:
            self._idle_plans = 0 if any(counts) or probe else self._idle_plans + 1
        return counts

    def best_counts(self, batch: int, rows: list[tuple[float, int]], limit: float = float("inf")) -> list[int]:
        """rows: (acceptance, drafts at most); the drafts per row (limit in all) that maximize
        expected tokens per millisecond (all 0 where none beats the plain step)."""
        gains = sorted(((a ** j, i) for i, (a, k) in enumerate(rows) for j in range(1, k + 1)), reverse=True)
        del gains[max(0, int(min(limit, len(gains)))):]
        best_n, best_rate, tokens = 0, batch / self.costs.plain(batch), float(batch)
        for n, (gain, _) in enumerate(gains, 1):
            tokens += gain
            rate = tokens / self.costs.drafting(batch, n)
            if rate > best_rate:
                best_n, best_rate = n, rate
        counts = [0] * len(rows)
        for _, i in gains[:best_n]:
            counts[i] += 1
        return counts
