"""Which way a batch of matcher calls runs (chooser.py): both are tried first, the faster is used,
and the slower is tried again less often the slower it was, so a way many times slower costs
little while a change of load is still noticed."""
from __future__ import annotations

from mlxr.engine.structured.chooser import MAX_BACKOFF, PARALLEL_ROWS, RETRY, TRIALS, KindChooser

ROWS = PARALLEL_ROWS


def run(chooser: KindChooser, us_per_row: dict[str, float], batches: int) -> list[str]:
    """The kinds chosen for `batches` large batches, each taking its kind's time."""
    chosen = []
    for _ in range(batches):
        kind = chooser.choose(ROWS)
        chooser.learn(kind, ROWS, us_per_row[kind] * ROWS / 1e6)
        chosen.append(kind)
    return chosen


def trials_of(kind: str, chosen: list[str]) -> int:
    return chosen[2 * TRIALS:].count(kind)


def test_both_kinds_are_tried_first_then_the_faster_is_used():
    chosen = run(KindChooser(), {"serial": 30.0, "parallel": 10.0}, 2 * TRIALS + 10)
    assert sorted(set(chosen[:2 * TRIALS])) == ["parallel", "serial"]
    assert set(chosen[2 * TRIALS:]) == {"parallel"}


def test_a_kind_as_fast_is_retried_every_retry_batches():
    batches = 2 * TRIALS + 4 * RETRY
    chosen = run(KindChooser(), {"serial": 10.0, "parallel": 10.0}, batches)
    assert trials_of("serial", chosen) + trials_of("parallel", chosen) == batches - 2 * TRIALS
    assert min(trials_of("serial", chosen), trials_of("parallel", chosen)) >= 3


def test_a_kind_four_times_slower_is_retried_four_times_less_often():
    chosen = run(KindChooser(), {"serial": 40.0, "parallel": 10.0}, 2 * TRIALS + 8 * RETRY)
    assert trials_of("serial", chosen) == 2  # every 4 * RETRY batches, not 8 times


def test_the_backoff_is_bounded_so_a_change_of_load_is_noticed():
    chooser = KindChooser(("step_thread", "worker"), run=2)
    chosen = run(chooser, {"step_thread": 1000.0, "worker": 5.0}, 2 * TRIALS + MAX_BACKOFF * RETRY)
    assert trials_of("step_thread", chosen) == 1
    # The step thread became the faster way: after its next trial it is used.
    chosen = run(chooser, {"step_thread": 1.0, "worker": 5.0}, MAX_BACKOFF * RETRY + 20)
    assert chosen[-10:] == ["step_thread"] * 10


def test_one_stalled_batch_does_not_hand_the_work_to_the_slower_kind():
    chooser = KindChooser(("step_thread", "worker"), run=2)
    run(chooser, {"step_thread": 40.0, "worker": 5.0}, 2 * TRIALS + 4)
    chooser.learn("worker", ROWS, 700.0 * ROWS / 1e6)  # one batch waited 140 times as long
    chosen = run(chooser, {"step_thread": 40.0, "worker": 5.0}, 20)
    assert chosen == ["worker"] * 20


def test_a_lasting_slowdown_still_moves_the_choice_within_a_few_batches():
    chooser = KindChooser(("step_thread", "worker"), run=2)
    run(chooser, {"step_thread": 40.0, "worker": 5.0}, 2 * TRIALS + 4)
    chosen = run(chooser, {"step_thread": 40.0, "worker": 700.0}, 12)
    assert chosen[-4:] == ["step_thread"] * 4


def test_a_stall_on_a_kinds_first_trial_is_dropped():
    chooser = KindChooser(("step_thread", "worker"), run=2)
    chosen = []
    for i in range(2 * TRIALS + 20):
        kind = chooser.choose(ROWS)
        slow = kind == "worker" and "worker" not in chosen  # the worker's first batch compiles a kernel
        chooser.learn(kind, ROWS, (700.0 if slow else {"step_thread": 40.0, "worker": 5.0}[kind]) * ROWS / 1e6)
        chosen.append(kind)
    assert chosen[-20:] == ["worker"] * 20


def test_a_zero_figure_still_learns_a_slowdown():
    chooser = KindChooser(("step_thread", "worker"), run=2)
    run(chooser, {"step_thread": 40.0, "worker": 0.0}, 2 * TRIALS + 4)
    chosen = run(chooser, {"step_thread": 40.0, "worker": 700.0}, 12)
    assert chosen[-4:] == ["step_thread"] * 4
