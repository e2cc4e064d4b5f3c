"""Cadence math, property-tested: no drift, coalescing, misfires, phase spread, cron and DST."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drumbeat import Cadence, InvalidJob
from drumbeat.keys import bucket_of
from drumbeat.schedule import (
    first_slot,
    is_misfire,
    jitter_ms,
    next_cron,
    next_rate_slot,
    phase_ms,
)

NOW = 1_790_000_000_000  # an epoch ms in 2026
intervals = st.integers(1, 24 * 3600 * 1000)
ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789:._-", min_size=1, max_size=40)


@given(now=st.integers(0, 2 * NOW), interval=intervals, data=st.data())
def test_first_slot_is_the_next_grid_point(now: int, interval: int, data: st.DataObject) -> None:
    phase = data.draw(st.integers(0, interval - 1))
    slot = first_slot(now, interval, phase)
    assert now <= slot < now + interval
    assert (slot - phase) % interval == 0


@given(
    interval=intervals,
    durations=st.lists(st.floats(0, 0.999), min_size=1, max_size=200),
    sid=ids,
)
def test_fixed_rate_never_drifts(interval: int, durations: list[float], sid: str) -> None:
    """Runs shorter than the interval: run n starts exactly n intervals after the first."""
    cadence = Cadence(every=interval / 1000)
    first, _ = cadence.first_due(sid, NOW)
    grid = first
    for n, fraction in enumerate(durations, start=1):
        end = grid + int(fraction * interval)
        grid, due, skipped = cadence.after_run(sid, grid, end)
        assert grid == first + n * interval == due
        assert skipped == 0


@given(interval=intervals, late=st.integers(0, 10**9), sid=ids)
def test_missed_slots_coalesce_into_one_run(interval: int, late: int, sid: str) -> None:
    """However long the outage or the run, one catch-up run at most, and still on the grid."""
    cadence = Cadence(every=interval / 1000)
    grid, _ = cadence.first_due(sid, NOW)
    end = grid + late
    nxt, _, skipped = cadence.after_run(sid, grid, end)
    assert (nxt - grid) % interval == 0
    assert nxt > grid
    if nxt <= end:  # due at once: the only catch-up run
        assert end - interval < nxt <= end
        following, _, again = cadence.after_run(sid, nxt, end)
        assert following > end and again == 0, "a second catch-up run"
        assert skipped == (nxt - grid) // interval - 1
    else:
        assert nxt == grid + interval and skipped == 0


@given(interval=intervals, late=st.integers(0, 10**8), run=st.integers(0, 10**4), sid=ids)
def test_a_late_start_stands_for_the_slots_passed_and_a_near_next_one(
    interval: int, late: int, run: int, sid: str
) -> None:
    """Catching up (a cold start: every schedule due at once), a schedule runs once: its next
    run is at least half an interval after this one's start, the first grid slot that is."""
    cadence = Cadence(every=interval / 1000)
    grid, _ = cadence.first_due(sid, NOW)
    start = grid + late
    end = start + min(run, interval // 4)  # a run shorter than the half interval
    nxt, _, skipped = cadence.after_run(sid, grid, end, start)
    floor = start + (interval + 1) // 2
    assert (nxt - grid) % interval == 0 and nxt >= grid + interval
    assert nxt >= floor, "a second run less than half an interval after a late one"
    assert nxt - interval < max(floor, grid + interval), "a slot skipped that was not near"
    assert skipped == (nxt - grid) // interval - 1
    if late < interval // 2:
        assert nxt == grid + interval, "a run on time (within half an interval) keeps the grid"


@given(grid=st.integers(0, NOW), interval=intervals, now=st.integers(0, 2 * NOW))
def test_next_rate_slot_is_latest_passed_or_next(grid: int, interval: int, now: int) -> None:
    slot, _ = next_rate_slot(grid, interval, now)
    assert (slot - grid) % interval == 0 and slot > grid
    assert slot > now or slot + interval > now


@given(interval=intervals, end=st.integers(0, NOW), sid=ids)
def test_fixed_delay_counts_from_the_end(interval: int, end: int, sid: str) -> None:
    cadence = Cadence(every=interval / 1000, mode="delay")
    grid, due, _ = cadence.after_run(sid, end - 5, end)
    assert grid == due == end + interval


@given(due=st.integers(0, NOW), lateness=st.integers(-1000, 10**7), grace=st.integers(0, 10**6))
def test_misfire_is_lateness_beyond_grace(due: int, lateness: int, grace: int) -> None:
    assert is_misfire(due, due + lateness, grace) == (grace > 0 and lateness > grace)


def test_phase_spread_is_uniform() -> None:
    interval = 5000
    buckets = Counter(
        phase_ms(f"monitor:u{i}:kw", interval) * 20 // interval for i in range(100_000)
    )
    assert len(buckets) == 20
    expected = 100_000 / 20
    # Chi-square with 19 degrees of freedom: 43.8 is the 0.1 % critical value.
    chi2 = sum((c - expected) ** 2 / expected for c in buckets.values())
    assert chi2 < 43.8, buckets


@given(sid=ids, grid=st.integers(0, NOW), jitter=st.integers(0, 60_000))
def test_jitter_is_bounded_and_stable(sid: str, grid: int, jitter: int) -> None:
    j = jitter_ms(sid, grid, jitter)
    assert 0 <= j <= jitter and j == jitter_ms(sid, grid, jitter)


def _ms(*args: int, tz: str) -> int:
    return int(datetime(*args, tzinfo=ZoneInfo(tz)).timestamp() * 1000)  # type: ignore[misc]


def _local(ms: int, tz: str) -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(tz)).isoformat()


def test_cron_in_a_time_zone() -> None:
    nine_tokyo = next_cron("0 9 * * *", "Asia/Tokyo", _ms(2026, 1, 1, tz="UTC"))
    assert datetime.fromtimestamp(nine_tokyo / 1000, UTC) == datetime(2026, 1, 2, 0, 0, tzinfo=UTC)


def test_cron_across_spring_forward_fires_once_when_the_clock_jumps() -> None:
    tz = "America/New_York"  # 2026-03-08 02:00 -> 03:00
    t = _ms(2026, 3, 7, 12, 0, tz=tz)
    fires = []
    for _ in range(3):
        t = next_cron("30 2 * * *", tz, t)
        fires.append(_local(t, tz))
    assert fires == [
        "2026-03-08T03:00:00-04:00",
        "2026-03-09T02:30:00-04:00",
        "2026-03-10T02:30:00-04:00",
    ]


def test_cron_across_fall_back_runs_a_daily_job_once() -> None:
    tz = "America/New_York"  # 2026-11-01 02:00 -> 01:00: 01:30 happens twice
    t = _ms(2026, 10, 31, 12, 0, tz=tz)
    fires = []
    for _ in range(3):
        t = next_cron("30 1 * * *", tz, t)
        fires.append(_local(t, tz))
    assert fires == [
        "2026-11-01T01:30:00-04:00",
        "2026-11-02T01:30:00-05:00",
        "2026-11-03T01:30:00-05:00",
    ]


def test_cron_every_hour_keeps_running_through_the_repeated_hour() -> None:
    tz = "America/New_York"
    t = _ms(2026, 11, 1, 0, 30, tz=tz)
    fires = []
    for _ in range(3):
        t = next_cron("0 * * * *", tz, t)
        fires.append(_local(t, tz))
    assert fires == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:00:00-05:00",
        "2026-11-01T02:00:00-05:00",
    ]


@given(after=st.integers(NOW, NOW + 10**11))
def test_cron_next_is_strictly_later_and_matches(after: int) -> None:
    # Through both DST changes: a job every quarter hour keeps running every 15 real minutes.
    nxt = next_cron("*/15 * * * *", "Europe/Berlin", after)
    assert nxt > after and nxt - after <= 15 * 60 * 1000
    assert datetime.fromtimestamp(nxt / 1000, UTC).minute % 15 == 0


@pytest.mark.parametrize(
    ("cadence", "message"),
    [
        (Cadence(), "exactly one of every"),
        (Cadence(every=5, cron="* * * * *"), "exactly one of every"),
        (Cadence(every=0), "every must be > 0"),
        (Cadence(every=-1), "every must be > 0"),
        (Cadence(every=0.5), "below the floor of 1.0 s"),
        (Cadence(every=True), "number of seconds"),  # type: ignore[arg-type]
        (Cadence(cron="61 * * * *"), "invalid cron expression"),
        (Cadence(cron="not cron"), "invalid cron expression"),
        (Cadence(cron="0 9 * * *", tz="Mars/Olympus"), "unknown time zone"),
        (Cadence(every=5, grace=0), "grace must be > 0"),
        (Cadence(every=5, jitter=-1), "jitter must be >= 0"),
        (Cadence(every=5, mode="sometimes"), "mode must be"),  # type: ignore[arg-type]
        (Cadence(cron="0 9 * * *", mode="delay"), "applies to every="),
    ],
)
def test_bad_cadences_are_refused(cadence: Cadence, message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        cadence.validate(floor=1.0)


@pytest.mark.parametrize("interval", [1_000, 5_000, 60_000, 3_600_000])
def test_schedules_of_one_phase_fire_together(interval: int) -> None:
    """The schedules of one of the 16,384 phases that share an interval fall due in one ms,
    so they wait in one time slot, which one claim takes whole."""
    by_bucket: dict[int, list[int]] = {}
    for i in range(50_000):
        sid = f"monitor:u{i}:kw"
        by_bucket.setdefault(bucket_of(sid), []).append(phase_ms(sid, interval))
    apart = {b: max(p) - min(p) for b, p in by_bucket.items() if max(p) != min(p)}
    assert not apart, f"buckets whose schedules fall due in different ms: {len(apart)}"
