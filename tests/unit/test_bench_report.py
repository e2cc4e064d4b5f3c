"""The periodic benchmark's medians: a repetition that delivered nothing must not vanish."""

from bench.periodic import Case, Outcome, _late, _median, table_lines

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
