"""The periodic benchmark's report: medians that keep empty repetitions, and run matching."""

from __future__ import annotations

from array import array

from bench.periodic import Case, Outcome, _late, _median, match_runs, table_lines

CASE = Case(100_000, 5.0)


def _rep(k: int, **metrics: float) -> Outcome:
    return Outcome("peer", CASE, k, metrics=dict(metrics))


def test_repetitions_with_no_run_in_the_window_count_as_beyond_it() -> None:
    group = [
        _rep(1, runs=0, pct_ideal=0.0),
        _rep(2, runs=0, pct_ideal=0.0),
        _rep(3, runs=100, pct_ideal=1.2, late_p99=0.999),
    ]
    assert _median(group, "pct_ideal") == 0.0
    assert _median(group, "late_p99") == float("inf")
    assert _late(_median(group, "late_p99")) == "no run"
    row = next(line for line in table_lines(group) if line.startswith("| peer"))
    assert "no run" in row and "3/3" in row


def test_one_empty_repetition_of_three_moves_the_median_up_only() -> None:
    group = [
        _rep(1, runs=0),
        _rep(2, runs=100, late_p99=0.5),
        _rep(3, runs=100, late_p99=0.2),
    ]
    assert _median(group, "late_p99") == 0.5


def test_failed_repetitions_are_left_out_of_the_median() -> None:
    broken = _rep(1, runs=0)
    broken.errors.append("no run started, in the window or before it")
    group = [broken, _rep(2, runs=100, late_p99=0.3)]
    assert _median(group, "late_p99") == 0.3


def _runs(*triples: tuple[int, float, float]) -> array[float]:
    return array("d", [x for t in triples for x in t])


def test_first_run_matching_counts_from_each_schedules_own_first_run() -> None:
    nan = float("nan")
    # schedule 0: first run 0.16 s after its tick, the next ones on later ticks (4.84 s on),
    # then a second run 1 s after the third: the only duplicate
    runs = _runs((0, nan, 100.16), (0, nan, 105.0), (0, nan, 110.0), (0, nan, 111.0))
    matched = match_runs(runs, n=1, interval=5.0, first=lambda i: 0.0, mode="first-run")
    assert matched.duplicates == 1
    # the phase is the earliest run's: the first run was 0.16 s late
    assert [round(x, 2) for x in matched.late] == [0.16, 0.0, 0.0]
