"""How ``drumbeat`` listings read: one line per row within 80 columns by default, ``--wide``
for every column, ``--json`` for scripts; against the session's redis-server.

The data is made so that cells would wrap at 80 columns: long task names, long errors with
newlines, long cadences. COLUMNS is unset, as when output goes to a pipe or a file.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from typer.testing import Result

import drumbeat
from drumbeat import admin
from tests.conftest import running_worker
from tests.integration.test_cli import APP, ROOT, _forget_app_module, ok, row

WIDTH = 80
AGO = r"(\d+\.\d|\d+|\d+m\d\d)s ago"  # fmt_duration's forms under an hour
LONG_TASK = "reports.monthly.build_customer_statement"
LONG_ERROR = "the statement service said no: upstream returned 503 Service Unavailable\n" * 2


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, namespace: str) -> Iterator[None]:
    monkeypatch.setenv("DRUMBEAT_REDIS_URL", redis_url)
    monkeypatch.setenv("DRUMBEAT_TEST_NAMESPACE", namespace)
    monkeypatch.delenv("COLUMNS", raising=False)
    _forget_app_module()
    yield
    _forget_app_module()


def fitted(result: Result) -> list[str]:
    """The output's lines, checked to fit in 80 columns."""
    lines = result.stdout.splitlines()
    wide = [line for line in lines if len(line) > WIDTH]
    assert not wide, f"{len(wide)} line(s) wider than {WIDTH} columns:\n{result.stdout}"
    return lines


def table_rows(lines: list[str]) -> list[list[str]]:
    """The cells of every body row of the (one) table in ``lines``."""
    return [[c.strip() for c in line.strip("│").split("│")] for line in lines if line[:1] == "│"]


def shown(cell: str, full: str) -> bool:
    """Whether ``cell`` is ``full`` (whitespace collapsed), or a beginning of it cut with "…"."""
    text = " ".join(full.split())
    return cell == text or (cell.endswith("…") and text.startswith(cell[:-1]) and len(cell) > 1)


def parse_iso(value: str) -> datetime:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", value), value
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def as_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json").stdout)


# -- dead ls -----------------------------------------------------------------------------------


def _fail(message: str) -> None:
    raise RuntimeError(message)


async def _dead_letters(app: drumbeat.App, n: int) -> list[str]:
    """``n`` jobs of a long-named task whose long, multi-line error dead-letters them, and one
    of a task nobody registered; their ids, newest first."""
    failing = app.task(name=LONG_TASK)(_fail)
    jobs = [await failing.aenqueue(f"{LONG_ERROR}#{i}") for i in range(n)]
    jobs += await app.aenqueue_many([drumbeat.Prepared("no.such.task", [1], {})])
    # No grace for an unknown task: dead-lettered at its first claim, not handed back.
    app.settings = app.settings.replace(unknown_task_grace=0.0)
    async with running_worker(app, concurrency=2):
        for job in jobs:
            with pytest.raises(drumbeat.JobFailed):
                await job.aresult(timeout=20)
    newest_first = app.redis.zrange(app.keys.dead, 0, -1, desc=True)
    return [i.decode() for i in newest_first]


async def test_dead_ls_fits_80_columns_one_line_per_letter(
    cli_env: None, app: drumbeat.App
) -> None:
    ids = await _dead_letters(app, 5)
    letters = {d.id: d for d in admin.dead_letters(app)}
    lines = fitted(ok("dead", "ls", APP))
    rows = table_rows(lines)
    assert len(rows) == len(ids), "\n".join(lines)  # no row wrapped onto a second line
    assert [r[0] for r in rows] == ids  # ids intact, newest first
    header = next(line for line in lines if line.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == ["job", "died", "task", "error"]
    for r in rows:
        assert re.fullmatch(AGO, r[1]), r
        assert shown(r[2], letters[r[0]].task), r
        assert shown(r[3], letters[r[0]].error), r
    assert any(r[2] == LONG_TASK[: len(r[2]) - 1] + "…" for r in rows), "no task name was cut"


async def test_dead_ls_wide_and_json(cli_env: None, app: drumbeat.App) -> None:
    ids = await _dead_letters(app, 3)

    wide = ok("dead", "ls", APP, "--wide").stdout
    assert row(wide, "job") == ["job", "died (UTC)", "task", "attempt", "error", "progress"]
    failing = next(d.id for d in admin.dead_letters(app) if d.task == LONG_TASK)
    first = row(wide, failing)
    assert first[2:4] == [LONG_TASK, "1"]  # in full, with the attempt
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", first[1])
    assert len(first[4]) == 60 and shown(first[4], f"RuntimeError: {LONG_ERROR}")
    assert len(table_rows(wide.splitlines())) == len(ids)

    doc = as_json("dead", "ls", APP)
    assert doc["total"] == len(ids)
    letters = doc["dead_letters"]
    assert [d["id"] for d in letters] == ids
    assert set(letters[0]) == {
        "id", "task", "died_ms", "died_at", "attempt", "error", "traceback", "progress"
    }  # fmt: skip
    one = next(d for d in letters if d["id"] == failing)
    assert one["task"] == LONG_TASK
    assert one["attempt"] == 1
    assert re.fullmatch(
        f"RuntimeError: {re.escape(LONG_ERROR)}#\\d", one["error"]
    )  # in full, with newlines
    assert "Traceback (most recent call last)" in one["traceback"]
    assert parse_iso(one["died_at"]).timestamp() * 1000 == pytest.approx(one["died_ms"])
    unknown = next(d for d in letters if d["task"] == "no.such.task")
    assert (unknown["attempt"], unknown["traceback"]) == (1, None)
    assert unknown["error"].startswith("no task named 'no.such.task'")

    limited = as_json("dead", "ls", APP, "--limit", "1")
    assert limited["total"] == len(ids) and len(limited["dead_letters"]) == 1
    assert as_json("dead", "ls", APP, "--limit", "1")["dead_letters"][0]["id"] == ids[0]
    ok("dead", "purge", APP, "--all", "--yes")
    assert as_json("dead", "ls", APP) == {"total": 0, "dead_letters": []}


# -- schedules ls / show -----------------------------------------------------------------------

SCHEDULE_IDS = [f"reports.monthly.customer-{n:03d}" for n in range(6)]
CADENCE = "cron 30 9 1 * * America/Argentina/Buenos_Aires, grace 1h, jitter 30s"


def _long_task(customer: str) -> None:
    raise RuntimeError(customer)


def _make_schedules(app: drumbeat.App) -> None:
    app.task(name=LONG_TASK)(_long_task)
    for schedule_id in SCHEDULE_IDS:
        app.schedule(
            schedule_id, LONG_TASK, cron="30 9 1 * *", tz="America/Argentina/Buenos_Aires",
            grace=3600, jitter=30, args=[schedule_id], priority=3,
        )  # fmt: skip
    app.pause(SCHEDULE_IDS[1])


async def test_schedules_ls_fits_80_columns(cli_env: None, app: drumbeat.App) -> None:
    _make_schedules(app)
    lines = fitted(ok("schedules", "ls", APP))
    rows = table_rows(lines)
    assert [r[0] for r in rows] == SCHEDULE_IDS, "\n".join(lines)  # one line each, ids intact
    for r in rows:
        assert shown(r[1], CADENCE), r
        paused = r[0] == SCHEDULE_IDS[1]
        assert r[2] == ("paused" if paused else "scheduled"), r
        assert (r[3] == "-") if paused else re.fullmatch(r"in \d\S*", r[3]), r


async def test_schedules_ls_wide_and_json(cli_env: None, app: drumbeat.App) -> None:
    _make_schedules(app)
    wide = ok("schedules", "ls", APP, "--wide").stdout
    assert row(wide, "id") == [
        "id", "task", "cadence", "priority", "state", "next due", "last run", "last duration",
        "last lateness", "runs", "failures", "misfires", "last error",
    ]  # fmt: skip
    first = row(wide, SCHEDULE_IDS[0])
    assert first[1:5] == [LONG_TASK, CADENCE, "3", "scheduled"]  # in full
    assert len(table_rows(wide.splitlines())) == len(SCHEDULE_IDS)

    doc = as_json("schedules", "ls", APP, "--limit", "4")
    assert doc["total"] == len(SCHEDULE_IDS)
    assert parse_iso(doc["now_at"]).timestamp() * 1000 == pytest.approx(doc["now_ms"])
    listed = doc["schedules"]
    assert [s["id"] for s in listed] == SCHEDULE_IDS[:4]
    one, paused = listed[0], listed[1]
    assert one == {
        "id": SCHEDULE_IDS[0],
        "task": LONG_TASK,
        "args": [SCHEDULE_IDS[0]],
        "kwargs": {},
        "cadence": {
            "every": None, "cron": "30 9 1 * *", "tz": "America/Argentina/Buenos_Aires",
            "mode": "rate", "grace": 3600, "jitter": 30,
        },
        "priority": 3,
        "queue": "default",
        "state": "scheduled",
        "next_due_ms": one["next_due_ms"],
        "next_due_at": one["next_due_at"],
        "last_run_ms": None,
        "last_run_at": None,
        "last_duration_ms": None,
        "last_lateness_ms": None,
        "runs": 0,
        "failures": 0,
        "misfires": 0,
        "last_error": None,
        "generation": one["generation"],
    }  # fmt: skip
    assert one["next_due_ms"] > doc["now_ms"]
    # 09:30 in Buenos Aires (UTC-3) is 12:30 UTC, on the first of a month
    assert parse_iso(one["next_due_at"]).strftime("%d %H:%M") == "01 12:30"
    assert paused["state"] == "paused" and paused["next_due_ms"] is None

    assert as_json("schedules", "show", APP, SCHEDULE_IDS[0]) == one
    prefixed = as_json("schedules", "ls", APP, "--prefix", "nothing.")
    assert (prefixed["total"], prefixed["schedules"]) == (0, [])


@pytest.mark.process
async def test_piped_output_is_80_wide_even_from_a_wide_terminal(
    app: drumbeat.App, redis_url: str, namespace: str
) -> None:
    """``drumbeat schedules ls APP | less`` in a 200-column terminal: stdin is that terminal,
    stdout a pipe. Rich alone would take the terminal's width from stdin."""
    _make_schedules(app)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env |= {"DRUMBEAT_REDIS_URL": redis_url, "DRUMBEAT_TEST_NAMESPACE": namespace}
    terminal, tty = pty.openpty()
    try:
        fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        proc = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "drumbeat", "schedules", "ls", APP],
            cwd=ROOT, env=env, stdin=tty, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(tty)
        os.close(terminal)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(map(len, lines)) <= WIDTH, proc.stdout
    assert [r[0] for r in table_rows(lines)] == SCHEDULE_IDS, proc.stdout


# -- status ------------------------------------------------------------------------------------


LONG_HOST = "worker-pool-7.internal"  # ids up to half the width stay whole


async def test_status_fits_80_columns_and_has_wide_and_json(
    cli_env: None, app: drumbeat.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: LONG_HOST)  # worker ids hold the host
    release = asyncio.Event()

    @app.task(name=LONG_TASK)
    async def hold() -> None:
        await release.wait()

    jobs = [await hold.aenqueue() for _ in range(3)]
    await app.aenqueue_many([drumbeat.Prepared("add", [1], {})] * 2)  # no slot left: ready
    try:
        async with running_worker(app, concurrency=3) as worker:
            deadline = time.monotonic() + 20
            while not (
                all([await j.astatus() is drumbeat.JobStatus.RUNNING for j in jobs])
                and await (await app.aredis()).zscore(app.keys.workers, worker.id) is not None
            ):
                assert time.monotonic() < deadline, "the worker did not claim the 3 jobs"
                await asyncio.sleep(0.02)
            # One at a time: the CLI runner swaps sys.stdout for the whole process.
            lines = fitted(await asyncio.to_thread(ok, "status", APP))
            running = [r for r in table_rows(lines) if r[0] in {j.id for j in jobs}]
            assert sorted(r[0] for r in running) == sorted(j.id for j in jobs), lines
            assert all(shown(r[1], worker.id) for r in running), lines
            workers = [r for r in table_rows(lines) if r[0] == worker.id]
            assert len(workers) == 1, lines  # its id intact, on one line
            assert re.fullmatch(AGO, workers[0][-1]), lines
            wide = await asyncio.to_thread(ok, "status", APP, "--wide")
            doc = await asyncio.to_thread(as_json, "status", APP)
    finally:
        release.set()

    assert row(wide.stdout, "worker") == [
        "worker",
        "host",
        "pid",
        "busy",
        "processed",
        "up",
        "heartbeat",
    ]
    assert row(wide.stdout, worker.id)[1:3] == [LONG_HOST, str(os.getpid())]
    assert worker.id.startswith(LONG_HOST)

    assert doc["namespace"] == app.settings.namespace
    assert doc["queue"] == {
        "ready": 2,
        "ready_by_priority": [2, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        "delayed": 0,
        "parked": 0,
        "waiting": 0,
        "running": 3,
        "dead": 0,
    }
    assert sorted(r["id"] for r in doc["running"]) == sorted(j.id for j in jobs)
    lease = doc["running"][0]
    assert lease["worker"] == worker.id
    assert lease["claimed_ms"] <= doc["now_ms"] < lease["lease_deadline_ms"]
    assert parse_iso(lease["lease_deadline_at"]).timestamp() * 1000 == pytest.approx(
        lease["lease_deadline_ms"]
    )
    (me,) = doc["workers"]
    assert (me["id"], me["host"], me["pid"]) == (worker.id, LONG_HOST, os.getpid())
    assert me["concurrency"] == 3
    assert set(me) == {
        "id", "host", "pid", "concurrency", "running", "processed", "started_ms", "started_at",
        "heartbeat_ms", "heartbeat_at",
    }  # fmt: skip
    assert doc["silent_workers"] == 0
    assert doc["schedules"] == {
        "total": 0, "shards": 1, "runs_last_minute": 0, "lateness_p50_ms": None,
        "lateness_p99_ms": None, "lateness_max_ms": None,
    }  # fmt: skip
