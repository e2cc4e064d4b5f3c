"""``drumbeat schedules`` and the schedules section of ``drumbeat status``, against the session's
redis-server.

Schedules are made with the API of the test's `app`, whose namespace the CLI's app module
(``tests.apps.cli_app``) reads from the environment set up by `cli_env`, as in test_cli.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator

import pytest

import drumbeat
from drumbeat.cli.tables import fmt_ms
from drumbeat.dashboard.schedules import schedule_json as dashboard_json
from drumbeat.testing import arun_until_idle
from tests.helpers import redis_now_ms, set_due
from tests.integration.test_cli import (
    APP,
    _forget_app_module,
    assert_clean_error,
    ok,
    row,
    run,
)

LONG_ERROR = "the report server said no " + "x" * 80


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, namespace: str) -> Iterator[None]:
    monkeypatch.setenv("DRUMBEAT_REDIS_URL", redis_url)
    monkeypatch.setenv("DRUMBEAT_TEST_NAMESPACE", namespace)
    monkeypatch.setenv("COLUMNS", "250")  # one line per row, even with twelve columns
    _forget_app_module()
    yield
    _forget_app_module()


def _add(a: int, b: int = 0) -> int:
    return a + b


def _boom(message: str = "boom") -> None:
    raise RuntimeError(message)


def _register(app: drumbeat.App) -> None:
    """The tasks of ``tests.apps.cli_app`` the schedules use, on the test's own app."""
    app.task(name="add")(_add)
    app.task(name="boom", retries=0)(_boom)


def _make_schedules(app: drumbeat.App) -> None:
    _register(app)
    app.schedule("ping.a", "add", every=5, args=[1, 2])
    app.schedule(
        "ping.b", "add", every=3600, mode="delay", grace=30, jitter=2, priority=4,
        kwargs={"a": 1, "b": "zwei"},
    )  # fmt: skip
    app.schedule("report.daily", "add", cron="0 9 * * *", tz="Asia/Tokyo", args=[3])


def _seconds(relative: str) -> float:
    """Seconds in a relative time of ``fmt_duration``'s forms (``3.2s``, ``12s``, ``59m59s``)."""
    m = re.fullmatch(r"(?:in |overdue )?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:([\d.]+)s)?(?: ago)?",
                     relative)  # fmt: skip
    assert m, relative
    d, h, mi, s = (float(g or 0) for g in m.groups())
    return d * 86400 + h * 3600 + mi * 60 + s


# -- help --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["schedules"],
        ["schedules", "ls"],
        ["schedules", "show"],
        ["schedules", "pause"],
        ["schedules", "resume"],
        ["schedules", "rm"],
        ["schedules", "run-now"],
    ],
    ids=" ".join,
)
def test_help_of_every_schedules_command(command: list[str]) -> None:
    result = ok(*command, "--help")
    assert "Usage" in result.output


def test_schedules_without_arguments_lists_its_commands() -> None:
    result = run("schedules")
    assert "Usage" in result.output
    for name in ("ls", "show", "pause", "resume", "rm", "run-now"):
        assert name in result.output
    assert "schedules" in run().output


# -- ls and show -------------------------------------------------------------------------------


async def test_ls_shows_cadence_state_and_times(cli_env: None, app: drumbeat.App) -> None:
    _make_schedules(app)
    out = ok("schedules", "ls", APP, "--wide").stdout
    header = row(out, "id")
    assert header == [
        "id", "task", "cadence", "priority", "state", "next due", "last run", "last duration",
        "last lateness", "runs", "failures", "misfires", "last error",
    ]  # fmt: skip

    a = row(out, "ping.a")
    assert a[1:5] == ["add", "every 5s", "0", "scheduled"]
    # Its first run is due within 5 s (its phase comes from its id); no worker runs it, so on
    # a slow machine that time may have passed by the time the CLI reads it.
    assert a[5].startswith(("in ", "overdue ")) and _seconds(a[5]) <= 5, a[5]
    assert a[6:] == ["-", "-", "-", "0", "0", "0", "-"]

    b = row(out, "ping.b")
    assert b[1:5] == ["add", "every 1h, delay, grace 30s, jitter 2s", "4", "scheduled"]
    assert b[5].startswith("in ") and _seconds(b[5]) <= 3602

    daily = row(out, "report.daily")
    assert daily[2] == "cron 0 9 * * * Asia/Tokyo"
    assert daily[5].startswith("in ") and _seconds(daily[5]) <= 86400
    assert "more" not in out


async def test_ls_filters_by_prefix_and_limits(cli_env: None, app: drumbeat.App) -> None:
    _make_schedules(app)
    pings = ok("schedules", "ls", APP, "--prefix", "ping.", "--wide").stdout
    assert row(pings, "ping.a") and row(pings, "ping.b")
    assert "report.daily" not in pings

    first = ok("schedules", "ls", APP, "--limit", "1", "--wide").stdout
    assert row(first, "ping.a")  # listed by id
    assert "ping.b" not in first and "report.daily" not in first
    assert "first 1 of 3" in first
    assert "2 more schedules matched" in first

    assert "1 more schedule matched" in ok("schedules", "ls", APP, "-p", "ping", "-n", "1").stdout
    # a prefix is literal, not a glob
    assert (
        "no schedules with ids starting 'ping*'" in ok("schedules", "ls", APP, "-p", "ping*").stdout
    )
    assert run("schedules", "ls", APP, "--limit", "0").exit_code == 2


def test_ls_of_an_app_without_schedules(cli_env: None) -> None:
    assert "no schedules" in ok("schedules", "ls", APP).stdout


async def test_next_due_is_relative_to_the_redis_clock(
    cli_env: None, app: drumbeat.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    _make_schedules(app)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 7200)  # this machine's clock is 2h fast
    out = ok("schedules", "ls", APP, "--wide").stdout
    due = row(out, "ping.a")[5]
    # Its first slot is within 5 s of now by the Redis clock: "in" a few seconds, or just
    # overdue when the command ran after it (read by this machine's clock: "overdue 2h").
    assert due.startswith(("in ", "overdue ")) and _seconds(due) <= 5


async def test_show_prints_every_field(cli_env: None, app: drumbeat.App) -> None:
    _make_schedules(app)
    out = ok("schedules", "show", APP, "ping.b").stdout
    assert row(out, "id")[1] == "ping.b"
    assert row(out, "task")[1] == "add"
    assert row(out, "args")[1] == "[]"
    assert row(out, "kwargs")[1] == '{"a": 1, "b": "zwei"}'
    assert row(out, "cadence")[1] == "every 1h, delay, grace 30s, jitter 2s"
    assert row(out, "every")[1] == "3600s"
    assert row(out, "mode")[1].startswith("delay")
    assert row(out, "grace")[1] == "30s"
    assert row(out, "jitter")[1] == "2s"
    assert row(out, "priority")[1] == "4"
    assert row(out, "state")[1] == "scheduled"
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC \(in .+\)", row(out, "next due")[1]
    )
    for field in ("last run", "last duration", "last lateness", "last error"):
        assert row(out, field)[1] == "-"
    for field in ("runs", "failures", "misfires"):
        assert row(out, field)[1] == "0"

    daily = ok("schedules", "show", APP, "report.daily").stdout
    assert row(daily, "args")[1] == "[3]"
    assert row(daily, "cron")[1] == "0 9 * * *"
    assert row(daily, "time zone")[1] == "Asia/Tokyo"
    # 09:00 in Tokyo is 00:00 UTC
    assert re.match(r"\d{4}-\d\d-\d\d 00:00:00\.000 UTC", row(daily, "next due")[1])

    assert_clean_error(run("schedules", "show", APP, "nope"), 1, "no schedule with id 'nope'")
    assert_clean_error(run("schedules", "show", APP, "bad id!"), 2, "schedule id")


# -- pause, resume, run-now, rm ----------------------------------------------------------------


async def test_pause_resume_run_now_rm(cli_env: None, app: drumbeat.App) -> None:
    _make_schedules(app)

    paused = ok("schedules", "pause", APP, "ping.a", "ping.b", "ghost")
    assert "paused 2 schedules" in paused.stdout
    assert "no schedule with id 'ghost'" in paused.stderr
    out = ok("schedules", "ls", APP, "--wide").stdout
    assert row(out, "ping.a")[4:6] == ["paused", "-"]
    assert row(out, "ping.b")[4] == "paused"
    assert row(out, "report.daily")[4] == "scheduled"
    assert app.redis.hexists(app.keys.paused, "ping.a")
    again = ok("schedules", "pause", APP, "ping.a")
    assert "paused 0 schedules" in again.stdout
    assert "1 already paused" in again.stderr

    resumed = ok("schedules", "resume", APP, "ping.a", "report.daily")
    assert "resumed 1 schedule" in resumed.stdout
    assert "1 not paused" in resumed.stderr
    a = row(ok("schedules", "ls", APP, "--wide").stdout, "ping.a")
    assert a[4] == "scheduled" and a[5].startswith("in ")

    queued = ok("schedules", "run-now", APP, "ping.a")
    assert "queued a run of 1 schedule" in queued.stdout
    info = app.get_schedule("ping.a")
    assert info is not None and info.next_due_ms is not None
    assert info.next_due_ms <= time.time() * 1000 + 1000, "its entry waits in the slot of now"
    twice = ok("schedules", "run-now", APP, "ping.a", "nobody")
    assert "queued a run of 0 schedules" in twice.stdout
    assert "1 already queued or running" in twice.stderr
    assert "no schedule with id 'nobody'" in twice.stderr

    # rm asks first; "no" keeps the schedule
    refused = run("schedules", "rm", APP, "ping.a", input="n\n")
    assert refused.exit_code == 1
    assert "Remove 1 schedule(s) for good?" in refused.output
    assert app.get_schedule("ping.a") is not None
    removed = ok("schedules", "rm", APP, "ping.a", "ping.b", "ghost", "--yes")
    assert "removed 2 schedules" in removed.stdout
    assert "no schedule with id 'ghost'" in removed.stderr
    assert app.get_schedule("ping.a") is None
    assert not app.redis.hexists(app.keys.where, "ping.a")  # its waiting entry went with it
    out = ok("schedules", "ls", APP, "--wide").stdout
    assert "ping." not in out
    assert row(out, "report.daily")
    assert_clean_error(run("schedules", "show", APP, "ping.a"), 1, "no schedule")

    nothing = ok("schedules", "rm", APP, "ghost")  # nothing to confirm
    assert "removed 0 schedules" in nothing.stdout
    assert_clean_error(run("schedules", "pause", APP, "bad id!"), 2, "schedule id")
    assert run("schedules", "pause", APP).exit_code == 2  # ids are required


# -- runs: ls, show and status -----------------------------------------------------------------


async def test_status_and_ls_after_a_worker_ran_schedules(cli_env: None, app: drumbeat.App) -> None:
    _register(app)
    before = ok("status", APP).stdout
    assert row(before, "schedules")[1] == "0"
    assert row(before, "shards")[1] == "1"
    assert row(before, "runs, last minute")[1] == "0"
    assert row(before, "lateness p50 / p99 / max")[1] == "-"

    app.schedule("tick", "add", every=1, args=[1, 1])
    app.schedule("fails", "boom", every=1, args=[LONG_ERROR])
    now_ms = redis_now_ms(app.redis)
    for schedule_id in ("tick", "fails"):  # due now, not at their place in the second
        set_due(app.redis, app, schedule_id, now_ms)
    # Each runs once at least (a next slot due while the worker is busy runs too).
    assert await arun_until_idle(app, concurrency=2) >= 2
    assert all(info.runs >= 1 for info in app.schedules())
    out = (await asyncio.to_thread(ok, "status", APP)).stdout
    assert row(out, "schedules")[1] == "2"
    assert int(row(out, "runs, last minute")[1]) >= 2
    lateness = row(out, "lateness p50 / p99 / max")[1]
    assert re.fullmatch(r"≤\S+ / ≤\S+ / \S+", lateness), lateness
    assert row(out, "ready")[1] == "0"  # queue rows are still there

    listing = ok("schedules", "ls", APP, "--wide").stdout
    tick = row(listing, "tick")
    assert tick[1:5] == ["add", "every 1s", "0", "scheduled"]
    assert tick[6].endswith(" ago")
    assert re.fullmatch(r"\d+(\.\d)?ms|\d+\.\ds", tick[7]), tick[7]  # last duration
    assert re.fullmatch(r"\d+(\.\d)?ms|\d+\.\ds", tick[8]), tick[8]  # last lateness
    assert int(tick[9]) >= 1 and tick[10:] == ["0", "0", "-"]
    fails = row(listing, "fails")
    assert int(fails[10]) >= 1
    assert fails[12].startswith("RuntimeError: the report server said no xxx")
    assert fails[12].endswith("…") and len(fails[12]) == 60

    shown = ok("schedules", "show", APP, "fails").stdout
    assert row(shown, "last error")[1] == f"RuntimeError: {LONG_ERROR}"  # in full
    assert row(shown, "last run")[1].endswith(" ago)")


async def test_ls_and_show_give_how_late_the_last_run_started(
    cli_env: None, app: drumbeat.App
) -> None:
    """The lateness a run's settle records (its start less its due time): a column of
    ``ls --wide``, a row of ``show``, and in --json the dashboard's field."""
    _register(app)
    app.schedule("behind", "add", every=3600, args=[1])
    app.schedule("never", "add", every=3600, args=[2])
    sec, usec = app.redis.time()
    due = int(sec) * 1000 + int(usec) // 1000 - 3000  # its run is 3 s overdue
    set_due(app.redis, app, "behind", due)
    assert await arun_until_idle(app) == 1, "the overdue run runs; the other is an hour away"
    info = app.get_schedule("behind")
    assert info is not None and info.last_run_ms is not None
    late = info.last_lateness_ms
    assert late is not None and late == info.last_run_ms - due >= 3000, (late, due)

    listing = (await asyncio.to_thread(ok, "schedules", "ls", APP, "--wide")).stdout
    column = row(listing, "id").index("last lateness")
    assert row(listing, "behind")[column] == fmt_ms(late)
    assert row(listing, "never")[column] == "-"
    shown = ok("schedules", "show", APP, "behind").stdout
    assert row(shown, "last lateness")[1] == f"{fmt_ms(late)} after its due time"
    assert row(ok("schedules", "show", APP, "never").stdout, "last lateness")[1] == "-"

    listed = {s["id"]: s for s in json.loads(ok("schedules", "ls", APP, "--json").stdout)[
        "schedules"]}  # fmt: skip
    assert listed["behind"]["last_lateness_ms"] == late
    assert listed["never"]["last_lateness_ms"] is None
    assert json.loads(ok("schedules", "show", APP, "behind", "--json").stdout)[
        "last_lateness_ms"] == late  # fmt: skip
    # The dashboard's /api gives the same field, under the same name.
    assert dashboard_json(info, 0)["last_lateness_ms"] == late
