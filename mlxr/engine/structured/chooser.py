"""Which of two ways of running a batch of matcher calls this host runs faster: serial or
parallel (mask fills, landed tokens), the step thread or a worker (where a mask fills). It is a
property of the host, not of the code: llguidance's executor threads sleep between steps and
must be woken and scheduled, which costs little on an idle many-core host and a time slice on a
loaded one (or one where PyTorch's OpenMP workers still spin after a CPU op), while the calling
thread is already running. So both are timed: each is tried in turn for the first few large
batches and again every RETRY batches times how many times slower it was (at most MAX_BACKOFF
times; that trial's time replaces the stale one), and the one with the lower recent time a row
is used in between; a kind's trials count by their best, and after them a batch enters its running
figure at most OUTLIER times that figure (one stalled batch must not flip the choice). The backoff: on the H100 host a batch-64 mask filled on the step thread took
~7 ms against ~0.35 ms of the step thread's time with the worker, and a serial fill ~3.5 times a
parallel one; a retry of the slower way every 64 steps cost ~0.1 ms a step on average
(bench/results/2026-11-25/structured_overhead-20261125T084616Z.json). No torch here: the
scheduler's landing uses it."""
from __future__ import annotations

PARALLEL_ROWS = 8  # below this many rows, serial always (waking threads costs more)
TRIALS = 4  # large batches of each kind before choosing
RETRY = 64  # a large batch of the kind not in use every RETRY batches, so a change of load is noticed
MAX_BACKOFF = 16  # ... times how many times slower it was, up to this many times
SMOOTHING = 0.25  # weight of the newest time in a kind's running figure
# A batch's time enters a kind's running figure at most OUTLIER times that figure. One batch may
# stall for reasons of its own (a kernel compiled on first use, a collection, a fill whose rows all
# sat inside length-bounded strings): on an H200 host one 44 ms wait for the worker's fill made the
# worker look 100 times slower than it was, and the step thread then filled 77 of 288 batch-64
# masks at ~2.5 ms each against ~0.3 ms of its time with the worker
# (bench/probes/mask_calls.py, mask_calls-20261128T193025Z). A real change of load still shows
# within a few batches: each may raise the figure by up to (1 - SMOOTHING) + SMOOTHING * OUTLIER.
OUTLIER = 4.0


class KindChooser:
    def __init__(self, kinds: tuple[str, str] = ("serial", "parallel"), run: int = 1) -> None:
        """kinds: the one small batches always use, and the other; run: trial batches of one
        kind in a row (2 where another chooser's trials, one a batch, run inside these: each
        of its kinds then meets each of these)."""
        self._small, self._other = kinds
        self._run = run
        self._us_per_row: dict[str, float | None] = {kind: None for kind in kinds}
        self._samples: dict[str, int] = {kind: 0 for kind in kinds}
        self._large = 0
        self._since_retry = 0
        self._retrying: str | None = None  # the slower kind, tried again: its new time replaces the stale one

    def choose(self, rows: int) -> str:
        if rows < PARALLEL_ROWS:
            return self._small
        self._large += 1
        n, us, small, other = self._large, self._us_per_row, self._small, self._other
        if n <= 2 * TRIALS:
            return other if (n - 1) // self._run % 2 == 0 else small
        if us[small] is None or us[other] is None:  # a trial's time never came back: try it again
            return small if us[small] is None else other
        best, worst = (other, small) if us[other] <= us[small] else (small, other)
        self._since_retry += 1
        if self._since_retry >= retry_interval(us[worst], us[best]):
            self._since_retry, self._retrying = 0, worst
            return worst
        return best

    def learn(self, kind: str, rows: int, seconds: float) -> None:
        """A batch of rows took seconds (batches under PARALLEL_ROWS teach nothing)."""
        if rows < PARALLEL_ROWS:
            return
        us_per_row, old = 1e6 * seconds / rows, self._us_per_row[kind]
        self._samples[kind] += 1
        if kind == self._retrying:
            self._retrying, old = None, None
        if old is None:
            self._us_per_row[kind] = us_per_row
        elif self._samples[kind] <= TRIALS:  # a trial: the best of them, so a first-use stall is dropped
            self._us_per_row[kind] = min(old, us_per_row)
        else:
            if old > 0:  # (a figure of 0 would clip every later batch to 0)
                us_per_row = min(us_per_row, OUTLIER * old)
            self._us_per_row[kind] = (1 - SMOOTHING) * old + SMOOTHING * us_per_row

    @property
    def us_per_row(self) -> dict[str, float | None]:
        """Each kind's running time a row (None until tried)."""
        return dict(self._us_per_row)


def retry_interval(slower_us: float, faster_us: float) -> int:
    """Large batches between two trials of the slower kind."""
    return RETRY * min(MAX_BACKOFF, max(1, int(slower_us / max(faster_us, 1e-9))))
