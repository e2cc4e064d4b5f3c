"""The ``drumbeat`` command, in process with typer's runner, against the session's redis-server.

The commands load ``tests.apps.cli_app:app``, which reads its URL and namespace from the
environment; the `cli_env` fixture points it at the test's namespace (the same one the `app`
fixture uses) and drops the module from ``sys.modules`` so no test sees another's app.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

import drumbeat
from drumbeat import admin, embedded
from drumbeat.cli import cli
from drumbeat.job import decode_spec
from drumbeat.testing import run_until_idle
from tests.conftest import _free_port, running_worker

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.cli_app:app"
MODULE = "tests.apps.cli_app"


def _forget_app_module() -> None:
    sys.modules.pop(MODULE, None)


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, namespace: str) -> Iterator[None]:
    monkeypatch.setenv("DRUMBEAT_REDIS_URL", redis_url)
    monkeypatch.setenv("DRUMBEAT_TEST_NAMESPACE", namespace)
    monkeypatch.setenv("COLUMNS", "200")  # rich tables keep 32-character ids on one line
    _forget_app_module()
    yield
    _forget_app_module()


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input)


def ok(*args: str, input: str | None = None) -> Result:
    result = run(*args, input=input)
    assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
    return result


def row(output: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in output.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row starting with {first!r} in:\n{output}")


def assert_clean_error(result: Result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    assert "error:" in result.output
    for fragment in fragments:
        assert fragment in result.output, result.output


# -- help --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["worker"],
        ["enqueue"],
        ["status"],
        ["redis"],
        ["dead"],
        ["dead", "ls"],
        ["dead", "retry"],
        ["dead", "purge"],
    ],
    ids=lambda c: " ".join(c) or "drumbeat",
)
def test_help_of_every_command(command: list[str]) -> None:
    result = ok(*command, "--help")
    assert "Usage" in result.output


def test_no_arguments_shows_help() -> None:
    result = run()
    assert "Usage" in result.output
    for name in ("worker", "enqueue", "status", "dead", "redis"):
        assert name in result.output


# -- enqueue and status ------------------------------------------------------------------------


async def test_enqueue_then_status_shows_depth_per_priority(
    cli_env: None, app: drumbeat.App
) -> None:
    by_flag = ok("enqueue", APP, "add", "[1, 2]", "--priority", "3").stdout.strip()
    by_default = ok("enqueue", APP, "urgent", "--kwargs", '{"note": "x"}').stdout.strip()
    by_name = ok(
        "enqueue", APP, "remote.only", '{"x": 1}', "--priority", "9", "--unregistered"
    ).stdout.strip()
    delayed = ok("enqueue", APP, "add", "[5]", "--delay", "60").stdout.strip()
    for job_id in (by_flag, by_default, by_name, delayed):
        assert re.fullmatch(r"[0-9a-f]{32}", job_id)

    raw = app.redis.hmget(app.keys.jobs, [by_flag, by_default, by_name])
    stored = [value for value in raw if isinstance(value, bytes)]
    assert len(stored) == 3
    specs = dict(zip((by_flag, by_default, by_name), map(decode_spec, stored), strict=True))
    assert (specs[by_flag].task, specs[by_flag].args) == ("add", [1, 2])
    assert (specs[by_default].task, specs[by_default].kwargs) == ("urgent", {"note": "x"})
    # a single JSON value that is not a list is the one positional argument
    assert (specs[by_name].task, specs[by_name].args) == ("remote.only", [{"x": 1}])

    stats = admin.queue_stats(app)
    assert stats.ready_by_priority == (0, 0, 0, 1, 0, 0, 0, 1, 0, 1)
    assert stats.delayed == 1
    assert app.job(delayed).status() is drumbeat.JobStatus.SCHEDULED

    out = ok("status", APP).stdout
    assert app.settings.namespace in out
    assert row(out, "ready")[1] == "3"
    assert row(out, "due later (delayed jobs, next runs)")[1] == "1"
    assert row(out, "running")[1] == "0"
    assert row(out, "dead letters")[1] == "0"
    assert row(out, "9")[1] == "1"
    assert row(out, "7")[1] == "1"
    assert row(out, "3")[1] == "1"
    with pytest.raises(AssertionError):
        row(out, "0")  # empty levels are left out


async def test_enqueue_with_key_reports_the_existing_job(cli_env: None, app: drumbeat.App) -> None:
    first = ok("enqueue", APP, "add", "[1]", "--key", "once")
    again = ok("enqueue", APP, "add", "[2]", "--key", "once")
    assert again.stdout.strip() == first.stdout.strip()
    assert "already queued" in again.stderr
    assert admin.queue_stats(app).ready == 1


def test_enqueue_unique_for_keeps_the_key_taken_after_the_job_ended(
    cli_env: None, namespace: str
) -> None:
    first = ok("enqueue", APP, "add", "[1]", "--key", "daily", "--unique-for", "60")
    brief = ok("enqueue", APP, "add", "[1]", "--key", "brief").stdout.strip()
    cli_app = sys.modules[MODULE].app
    assert run_until_idle(cli_app, timeout=10) == 2
    again = ok("enqueue", APP, "add", "[2]", "--key", "daily")
    assert again.stdout.strip() == first.stdout.strip(), "the window holds the key"
    assert "its unique_for window is open" in again.stderr
    assert ok("enqueue", APP, "add", "[2]", "--key", "brief").stdout.strip() != brief
    assert admin.queue_stats(cli_app).ready == 1, "a key without a window is free once done"
    assert_clean_error(run("enqueue", APP, "add", "[1]", "--unique-for", "5"), 2, "needs key=")


async def test_enqueue_bad_input_exits_2_with_a_message(cli_env: None, app: drumbeat.App) -> None:
    assert_clean_error(run("enqueue", APP, "add", "[1, 2"), 2, "ARGS_JSON is not valid JSON")
    assert_clean_error(
        run("enqueue", APP, "add", "[1]", "--kwargs", "{nope}"), 2, "--kwargs is not valid JSON"
    )
    assert_clean_error(
        run("enqueue", APP, "add", "--kwargs", "[1]"), 2, "--kwargs must be a JSON object"
    )
    assert_clean_error(run("enqueue", APP, "add", "[1]", "--key", "has space"), 2, "dedup key")
    assert_clean_error(run("enqueue", APP, "bad name!", "[1]"), 2, "no task named 'bad name!'")
    assert_clean_error(run("enqueue", APP, "bad name!", "[1]", "--unregistered"), 2, "task name")

    result = run("enqueue", APP, "add", "[1]", "--priority", "12")
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "--priority" in result.output
    # The wording is typer's own: "0<=x<=9" in 0.26, "less than or equal to 9" in 0.29.
    assert re.search(r"(less than or equal to|<=x<=)\W*9", result.output), result.output
    assert run("enqueue", APP, "add", "--delay", "-1").exit_code == 2

    assert admin.queue_stats(app).ready == 0


async def test_enqueue_takes_short_task_names_and_refuses_unknown_ones(
    cli_env: None, app: drumbeat.App
) -> None:
    # A short name (or dotted tail) that one task has stands for it, with that task's defaults.
    short = ok("enqueue", APP, "render", "[5]").stdout.strip()
    tail = ok("enqueue", APP, "reports.render", "[6]", "--priority", "8").stdout.strip()
    full = ok("enqueue", APP, "tasks.build", "[7]").stdout.strip()
    specs = {
        job_id: decode_spec(raw)
        for job_id, raw in zip(
            (short, tail, full), app.redis.hmget(app.keys.jobs, [short, tail, full]), strict=True
        )
        if isinstance(raw, bytes)
    }
    assert [(specs[i].task, specs[i].args) for i in (short, tail, full)] == [
        ("tasks.reports.render", [5]),
        ("tasks.reports.render", [6]),
        ("tasks.build", [7]),
    ]
    assert admin.queue_stats(app).ready_by_priority[2] == 1  # render's own priority
    assert admin.queue_stats(app).ready_by_priority[8] == 1

    # A name no task has is refused (no worker of this app could run it), with a suggestion.
    assert_clean_error(
        run("enqueue", APP, "tasks.biuld", "[5]"),
        2,
        "no task named 'tasks.biuld'",
        "did you mean tasks.build",
    )
    assert_clean_error(run("enqueue", APP, "rendr", "[5]"), 2, "did you mean tasks.reports.render?")
    assert_clean_error(
        run("enqueue", APP, "zzz", "[5]"), 2, "expected one of: add, boom, legacy.build"
    )
    # A short name two tasks have names neither.
    assert_clean_error(
        run("enqueue", APP, "build", "[5]"),
        2,
        "'build' is ambiguous",
        "legacy.build and tasks.build",
        "give the full name",
    )
    assert admin.queue_stats(app).ready == 3

    # --unregistered: the exact name, for workers whose app has the task.
    remote = ok("enqueue", APP, "remote.build", "[1]", "--unregistered").stdout.strip()
    raw = app.redis.hget(app.keys.jobs, remote)
    assert isinstance(raw, bytes) and decode_spec(raw).task == "remote.build"


def test_bad_app_spec_is_a_clear_error(cli_env: None) -> None:
    assert_clean_error(run("status", "no_such_module_xyz:app"), 2, "cannot import")
    assert_clean_error(run("status", f"{MODULE}:nope"), 2, "has no attribute 'nope'")
    assert_clean_error(run("status", f"{MODULE}:not_an_app"), 2, "not a drumbeat.App")
    assert_clean_error(run("status", ":app"), 2, "expected MODULE:APP")
    assert_clean_error(run("worker", "no_such_module_xyz"), 2, "cannot import")
    # MODULE alone means MODULE:app
    assert row(ok("status", MODULE).stdout, "ready")[1] == "0"


def test_unreachable_redis_is_one_red_line(cli_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRUMBEAT_REDIS_URL", f"redis://127.0.0.1:{_free_port()}/0")
    assert_clean_error(run("status", APP), 1, "cannot connect to Redis")
    assert_clean_error(run("enqueue", APP, "add", "[1]"), 1, "cannot connect to Redis")


async def test_status_lists_running_jobs_and_live_workers(cli_env: None, app: drumbeat.App) -> None:
    release = asyncio.Event()

    @app.task(name="hold")
    async def hold() -> None:
        await release.wait()

    job = await hold.aenqueue()
    async with running_worker(app, concurrency=3) as worker:
        for _ in range(200):
            if await job.astatus() is drumbeat.JobStatus.RUNNING:
                break
            await asyncio.sleep(0.02)
        # The heartbeat thread registers the worker as soon as it starts.
        client = await app.aredis()
        for _ in range(200):
            if await client.zscore(app.keys.workers, worker.id) is not None:
                break
            await asyncio.sleep(0.02)
        out = (await asyncio.to_thread(ok, "status", APP, "--wide")).stdout
        release.set()

    assert row(out, "running")[1] == "1"
    assert row(out, "workers")[1] == "1"
    job_row = row(out, job.id)
    assert job_row[1] == worker.id
    assert job_row[2].endswith("s")  # lease age
    worker_row = row(out, worker.id)
    assert str(os.getpid()) in worker_row
    assert worker_row[-1].endswith("ago")
    assert re.fullmatch(r"\d+\.\ds ago", worker_row[-1])
    assert worker_row[3] in ("0/3", "1/3")  # busy/slots, as of its last heartbeat


# -- dead letters ------------------------------------------------------------------------------


def _explode(what: str) -> None:
    raise ValueError(f"kaput {what}")


async def _make_dead(app: drumbeat.App) -> tuple[str, str]:
    """One job of a task nobody registered, one whose task raises; both end up dead."""

    explode = app.tasks.get("explode") or app.task(name="explode")(_explode)
    unknown = await app.aenqueue_many([drumbeat.Prepared("no.such.task", [1], {})])
    failing = await explode.aenqueue("now")
    # No grace for an unknown task: dead-lettered at its first claim, not handed back.
    app.settings = app.settings.replace(unknown_task_grace=0.0)
    async with running_worker(app, concurrency=2):
        for job in (unknown[0], failing):
            with pytest.raises(drumbeat.JobFailed):
                await job.aresult(timeout=10)
    return unknown[0].id, failing.id


async def test_dead_ls_retry_purge_round_trip(cli_env: None, app: drumbeat.App) -> None:
    unknown, failing = await _make_dead(app)

    out = ok("dead", "ls", APP, "--wide").stdout
    unknown_row, failing_row = row(out, unknown), row(out, failing)
    assert unknown_row[2] == "no.such.task"
    assert "no task named 'no.such.task'" in unknown_row[4]
    assert failing_row[2:4] == ["explode", "1"]
    assert failing_row[4] == "ValueError: kaput now"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", failing_row[1])

    with_tb = ok("dead", "ls", APP, "--traceback").stdout
    assert "Traceback (most recent call last)" in with_tb
    assert "kaput now" in with_tb

    assert "newest 1 of 2" in ok("dead", "ls", APP, "--limit", "1").stdout
    assert row(ok("status", APP).stdout, "dead letters")[1] == "2"

    # retry and purge need ids or --all, not neither and not both
    assert_clean_error(run("dead", "retry", APP), 2, "nothing to retry")
    assert_clean_error(run("dead", "purge", APP, "--yes"), 2, "nothing to purge")
    assert_clean_error(run("dead", "retry", APP, failing, "--all"), 2, "not both")

    retried = ok("dead", "retry", APP, failing, "0" * 32)
    assert "requeued 1 job" in retried.stdout
    assert "1 id(s) were not requeued" in retried.stderr
    assert await app.job(failing).astatus() is drumbeat.JobStatus.QUEUED
    assert admin.queue_stats(app).ready == 1

    # purge asks first; "no" keeps the dead letter
    refused = run("dead", "purge", APP, unknown, input="n\n")
    assert refused.exit_code == 1
    assert "Delete 1 dead letter(s) for good?" in refused.output
    assert admin.dead_count(app) == 1
    purged = ok("dead", "purge", APP, unknown, input="y\n")
    assert "purged 1 job" in purged.stdout
    assert admin.dead_count(app) == 0
    assert not app.redis.hexists(app.keys.jobs, unknown)
    assert "no dead letters" in ok("dead", "ls", APP).stdout


async def test_dead_retry_all_and_purge_all(cli_env: None, app: drumbeat.App) -> None:
    await _make_dead(app)
    assert "requeued 2 jobs" in ok("dead", "retry", APP, "--all").stdout
    assert admin.dead_count(app) == 0
    assert admin.queue_stats(app).ready == 2

    await _make_dead(app)  # the requeued pair dies again, with two new ones
    assert admin.dead_count(app) == 4
    refused = run("dead", "purge", APP, "--all", input="n\n")
    assert refused.exit_code == 1
    assert "all 4 dead letters" in refused.output
    assert "purged 4 jobs" in ok("dead", "purge", APP, "--all", "--yes").stdout
    assert admin.dead_count(app) == 0
    assert "no dead letters" in ok("dead", "purge", APP, "--all").stdout


# -- embedded Redis ----------------------------------------------------------------------------


def test_redis_command_shows_starts_and_stops_the_embedded_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = Path(tempfile.mkdtemp(prefix="dbcli-", dir="/tmp"))
    monkeypatch.setenv("DRUMBEAT_HOME", str(home))
    monkeypatch.delenv("DRUMBEAT_REDIS_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    try:
        out = ok("redis").stdout
        assert "not running" in out
        assert str(home / "redis.sock") in out

        started = ok("redis", "--start").stdout
        assert row(started, "state")[1] == "running"
        pid = int(row(started, "pid")[1])
        assert pid > 0
        assert row(started, "aof")[1] == "on"
        assert embedded.status(home).running

        again = ok("redis").stdout
        assert row(again, "pid")[1] == str(pid)

        assert_clean_error(run("redis", "--start", "--stop"), 2, "exclude each other")

        stopped = ok("redis", "--stop").stdout
        assert "stopped the embedded Redis" in stopped
        assert "not running" in stopped
        assert not embedded.status(home).running
        assert "was not running" in ok("redis", "--stop").stdout
    finally:
        embedded.stop(home)
        shutil.rmtree(home, ignore_errors=True)


# -- a real worker process ---------------------------------------------------------------------


def _start_worker(redis_url: str, namespace: str, **env: str) -> subprocess.Popen[bytes]:
    environ = {
        **os.environ,
        "DRUMBEAT_REDIS_URL": redis_url,
        "DRUMBEAT_TEST_NAMESPACE": namespace,
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "drumbeat", "worker", APP, "--concurrency", "2"],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


async def _terminate(proc: subprocess.Popen[bytes], within: float = 5.0) -> tuple[int, str]:
    """SIGTERM, then the exit code and the output; fails if it takes longer than ``within``."""
    try:
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = await asyncio.to_thread(proc.wait, within + 5)
        assert time.monotonic() - started < within
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        output = proc.stdout.read().decode()
        proc.stdout.close()
    return code, output


@pytest.mark.process
async def test_worker_subprocess_runs_a_job_and_exits_0_on_sigterm(
    app: drumbeat.App, redis_url: str, namespace: str
) -> None:
    proc = _start_worker(redis_url, namespace)
    try:
        job = await app.aenqueue_many([drumbeat.Prepared("add", [20, 22], {})])
        assert await job[0].aresult(timeout=20) == 42
        client = await app.aredis()
        assert await client.zcard(app.keys.workers) == 1
    finally:
        code, output = await _terminate(proc)
    assert code == 0, output
    assert "started: 2 slots" in output, output
    assert "stopped: 1 processed, 0 failed" in output, output
    assert await (await app.aredis()).zcard(app.keys.workers) == 0  # deregistered


@pytest.mark.process
async def test_worker_subprocess_does_not_hang_on_a_sync_task_that_ignores_shutdown(
    app: drumbeat.App, redis_url: str, namespace: str
) -> None:
    proc = _start_worker(redis_url, namespace, DRUMBEAT_SHUTDOWN_GRACE="0.5")
    try:
        job = (await app.aenqueue_many([drumbeat.Prepared("nap", [60], {})]))[0]
        for _ in range(500):
            if await job.astatus() is drumbeat.JobStatus.RUNNING:
                break
            await asyncio.sleep(0.02)
        assert await job.astatus() is drumbeat.JobStatus.RUNNING
    finally:
        code, output = await _terminate(proc)
    assert code == 0, output
    assert "still running" in output, output
    assert await job.astatus() is drumbeat.JobStatus.QUEUED  # handed back


async def test_cancel_a_queued_job_and_nothing_to_cancel(cli_env: None, app: drumbeat.App) -> None:
    job = app.enqueue("add", 1, 2)
    done = run("cancel", APP, job.id)
    assert done.exit_code == 0 and f"cancelled {job.id}" in done.output, done.output
    assert job.status() is drumbeat.JobStatus.CANCELLED
    again = run("cancel", APP, job.id)
    assert again.exit_code == 1 and "nothing to cancel" in again.output, again.output
