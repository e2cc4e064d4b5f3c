"""`drumbeat.testing.run_until_idle` and ``drumbeat worker --burst``: a real worker until nothing
is left, against the session's redis-server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import drumbeat
from drumbeat.cli import USAGE_ERROR, cli
from drumbeat.testing import NotIdle, arun_until_idle, run_until_idle

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sync_app(redis_url: str, namespace: str) -> Iterator[drumbeat.App]:
    """An app for a plain (not async) test: `run_until_idle` runs its own event loop."""
    app = drumbeat.App(redis_url, namespace=namespace)
    yield app
    app.close()


def test_runs_what_is_queued_and_returns_how_many_runs_it_made(sync_app: drumbeat.App) -> None:
    seen: list[int] = []

    @sync_app.task
    def add(a: int, b: int) -> int:
        seen.append(a + b)
        return a + b

    jobs = [add.enqueue(i, 1) for i in range(3)]
    assert run_until_idle(sync_app) == 3
    assert sorted(seen) == [1, 2, 3]
    assert [job.status() for job in jobs] == ["complete"] * 3
    assert run_until_idle(sync_app) == 0  # nothing left: idle at once


def test_waits_for_a_delayed_job_due_within_the_timeout(sync_app: drumbeat.App) -> None:
    @sync_app.task
    def later() -> str:
        return "ran"

    job = later.options(delay=0.5).enqueue()
    assert run_until_idle(sync_app, timeout=10) == 1
    assert job.result(timeout=1) == "ran"


def test_leaves_a_delayed_job_due_after_the_timeout(sync_app: drumbeat.App) -> None:
    @sync_app.task
    def much_later() -> None: ...

    job = much_later.options(delay=3600).enqueue()
    assert run_until_idle(sync_app, timeout=5) == 0
    assert job.status() == "scheduled"


def test_waits_for_a_retry_backing_off(sync_app: drumbeat.App) -> None:
    attempts: list[int] = []

    @sync_app.task(retries=2, backoff=0.5)
    def flaky() -> str:
        attempts.append(drumbeat.current_job().attempt)
        if len(attempts) == 1:
            raise ValueError("the first attempt fails")
        return "ok"

    job = flaky.enqueue()
    assert run_until_idle(sync_app, timeout=10) == 2  # each attempt counts
    assert job.result(timeout=1) == "ok"
    assert len(attempts) == 2


def test_waits_for_jobs_parked_on_a_concurrency_limit(sync_app: drumbeat.App) -> None:
    @sync_app.task(concurrency_limit=1)
    async def one_at_a_time(n: int) -> int:
        await asyncio.sleep(0.05)
        return n

    jobs = [one_at_a_time.enqueue(n) for n in range(3)]
    assert run_until_idle(sync_app, timeout=20) == 3
    assert [job.result(timeout=1) for job in jobs] == [0, 1, 2]


def test_does_not_wait_for_a_schedules_next_run(sync_app: drumbeat.App) -> None:
    @sync_app.task
    def tick() -> None: ...

    @sync_app.task
    def work() -> str:
        return "done"

    sync_app.schedule("hourly", tick, every=3600)
    job = work.enqueue()
    assert run_until_idle(sync_app, timeout=10) >= 1
    assert job.result(timeout=1) == "done"


def test_raises_on_timeout_saying_what_was_still_pending(sync_app: drumbeat.App) -> None:
    @sync_app.task
    async def hangs() -> None:
        await asyncio.sleep(60)

    hangs.enqueue()
    hangs.enqueue()
    with pytest.raises(NotIdle, match=r"not idle within 0\.5 s.*1 ready, 1 running") as caught:
        run_until_idle(sync_app, timeout=0.5, concurrency=1)
    assert isinstance(caught.value, TimeoutError)


def test_a_failing_job_counts_and_is_dead_lettered_as_by_a_worker(sync_app: drumbeat.App) -> None:
    @sync_app.task
    def boom() -> None:
        raise RuntimeError("boom")

    job = boom.enqueue()
    assert run_until_idle(sync_app) == 1
    with pytest.raises(drumbeat.JobFailed, match="boom"):
        job.result(timeout=1)


async def test_the_async_twin_runs_on_the_callers_loop(app: drumbeat.App) -> None:
    @app.task
    async def double(n: int) -> int:
        return 2 * n

    job = await double.aenqueue(21)
    assert await arun_until_idle(app) == 1
    assert await job.aresult(timeout=1) == 42


async def test_the_sync_one_refuses_a_running_loop(app: drumbeat.App) -> None:
    with pytest.raises(drumbeat.ConfigurationError, match="arun_until_idle"):
        run_until_idle(app)


# -- drumbeat worker --burst -------------------------------------------------------------------


def test_burst_worker_exits_0_once_idle(redis_url: str, namespace: str) -> None:
    env = {**os.environ, "DRUMBEAT_REDIS_URL": redis_url, "DRUMBEAT_TEST_NAMESPACE": namespace}
    producer = drumbeat.App(redis_url, namespace=namespace)
    try:

        @producer.task(name="add")  # the name tests.apps.cli_app's worker knows
        def add(a: int, b: int = 0) -> int: ...

        jobs = [add.enqueue(1, 2) for _ in range(3)]
        jobs.append(add.options(delay=0.5).enqueue(2, 2))
        proc = subprocess.run(
            [sys.executable, "-m", "drumbeat", "worker", "tests.apps.cli_app:app", "--burst",
             "--burst-wait", "5"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "4 runs" in proc.stderr
        assert [job.status() for job in jobs] == ["complete"] * 4
    finally:
        producer.close()


def test_burst_refuses_several_processes() -> None:
    result = CliRunner().invoke(
        cli, ["worker", "tests.apps.cli_app:app", "--burst", "--processes", "2"]
    )
    assert result.exit_code == USAGE_ERROR, result.output
    assert "--burst runs one worker process" in result.output
