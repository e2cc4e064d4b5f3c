"""The elastic-pool benchmark's figures: from process samples to the report's table, and the
original design's rule."""

from __future__ import annotations

from bench.elastic import (
    Config,
    OriginalRule,
    RunResult,
    Sample,
    aggregate,
    process_seconds,
    summarize,
    table_lines,
)

CFG = Config(repeat=3, minimum=1, maximum=4, scale_down_after=5.0)


def _run(policy: str, rep: int, counts: list[tuple[float, int, int, int]]) -> RunResult:
    """A run from (t, processes, registered, backlog) samples; running is 0 with no backlog."""
    samples = [Sample(t, p, r, b, 10 if b else 0) for t, p, r, b in counts]
    return RunResult(policy, rep, samples, done=5000)


# an autoscaled run: idle at 1, the step at 0, 4 processes at 1.2 s registered at 2.0 s,
# drained at 7.0 s, one retired every 5 s, at MIN at 22.4 s
SCALED = [
    (-1.0, 1, 1, 0),
    (0.0, 1, 1, 5000),
    (1.2, 4, 1, 4800),
    (2.0, 4, 4, 4000),
    (7.0, 4, 4, 0),
    (12.2, 3, 3, 0),
    (17.2, 2, 2, 0),
    (22.4, 1, 1, 0),
]


def test_a_run_summary_reads_capacity_drain_and_return_to_min_from_samples() -> None:
    s = summarize(_run("autoscale", 1, SCALED).samples, minimum=1, maximum=4)
    assert s["full"] == 2.0, "full capacity is MAX workers registered, not merely started"
    assert s["drained"] == 7.0
    assert s["back_to_min"] == 22.4
    assert s["peak"] == 4


def test_a_pool_that_never_grows_or_shrinks_says_so() -> None:
    fixed_max = [(0.0, 4, 4, 5000), (7.0, 4, 4, 0), (32.0, 4, 4, 0)]
    s = summarize(_run("fixed-max", 1, fixed_max).samples, minimum=1, maximum=4)
    assert (s["full"], s["drained"], s["back_to_min"]) == (0.0, 7.0, None)
    fixed_min = [(0.0, 1, 1, 5000), (25.0, 1, 1, 0)]
    s = summarize(_run("fixed-min", 1, fixed_min).samples, minimum=1, maximum=4)
    assert (s["full"], s["drained"], s["back_to_min"]) == (None, 25.0, 25.0)


def test_process_seconds_hold_each_count_until_the_next_sample_and_the_last_to_the_end() -> None:
    samples = _run("autoscale", 1, SCALED).samples
    # 1 x 1.2 + 4 x (12.2 - 1.2) + 3 x 5 + 2 x 5.2 + 1 x (30 - 22.4); the idle sample before
    # the step does not count
    assert abs(process_seconds(samples, 30.0) - (1.2 + 44 + 15 + 10.4 + 7.6)) < 1e-9


def test_the_table_gives_medians_and_never_for_what_did_not_happen() -> None:
    runs = [
        _run("autoscale", 1, SCALED),
        _run("autoscale", 2, [(t + 0.5 * (t > 0), p, r, b) for t, p, r, b in SCALED]),
        _run("autoscale", 3, [(t + 1.0 * (t > 0), p, r, b) for t, p, r, b in SCALED]),
        _run(
            "original", 1, [(0.0, 1, 1, 5000), (1.1, 4, 4, 3000), (6.5, 4, 4, 0), (26.5, 4, 4, 0)]
        ),
    ]
    broken = _run("original", 2, [(0.0, 1, 1, 5000)])
    broken.errors.append("the supervisor exited with 1")
    table = aggregate([*runs, broken], CFG)
    assert table["autoscale"]["drained"]["median"] == 7.5
    assert (table["autoscale"]["drained"]["min"], table["autoscale"]["drained"]["max"]) == (
        7.0,
        8.0,
    )
    assert table["original"]["back_to_min"]["never"] == 1
    assert (table["original"]["runs"], table["original"]["failed"]) == (1, 1)
    lines = table_lines(table, CFG)
    auto = next(x for x in lines if x.startswith("| autoscale"))
    assert "| 7.5 (7.0-8.0) |" in auto and "| 22.9 (22.4-23.4) |" in auto
    original = next(x for x in lines if x.startswith("| original"))
    assert "never (within 25 s of the drain)" in original and "1 failed" in original


def test_the_original_rule_is_queue_length_over_50_plus_one_within_min_and_max() -> None:
    assert [OriginalRule.target(n, 1, 4) for n in (0, 49, 50, 149, 150, 5000)] == [
        1,
        1,
        2,
        3,
        4,
        4,
    ]
    assert OriginalRule.target(0, 2, 4) == 2
