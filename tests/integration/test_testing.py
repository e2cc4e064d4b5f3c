"""`drumbeat.testing.run_until_idle` and ``drumbeat worker --burst``: a real worker until nothing
is left, against the session's redis-server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import drumbeat
from drumbeat.cli import USAGE_ERROR, cli
from drumbeat.testing import NotIdle, arun_until_idle, run_until_idle
from drumbeat.worker.idle import Reader, until_idle
from drumbeat.worker.process import Worker
from tests.helpers import wait_for_async

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


def test_runs_a_schedule_run_made_due_by_run_now(sync_app: drumbeat.App) -> None:
    seen: list[str] = []

    @sync_app.task
    def report(name: str) -> None:
        seen.append(name)

    sync_app.schedule("daily-report", report, every=86400, args=["daily"])
    assert sync_app.run_now("daily-report") == 1
    assert run_until_idle(sync_app, timeout=10) == 1
    assert seen == ["daily"]
    assert run_until_idle(sync_app, timeout=10) == 0  # its next run is a day away


@pytest.mark.parametrize(("job_shards", "schedule_shards"), [(1, 3), (2, 2)])
def test_runs_the_run_now_runs_of_every_schedule_shard(
    redis_url: str, namespace: str, job_shards: int, schedule_shards: int
) -> None:
    app = drumbeat.App(
        redis_url, namespace=namespace, job_shards=job_shards, schedule_shards=schedule_shards
    )
    try:
        seen: list[int] = []

        @app.task
        def report(n: int) -> None:
            seen.append(n)

        for n in range(8):
            app.schedule(f"report-{n}", report, every=86400, args=[n])
        homes = {app.scheduler.shard_of(f"report-{n}") for n in range(8)}
        assert len(homes) > 1, "the schedules should live in several shards"
        assert app.run_now(*(f"report-{n}" for n in range(8))) == 8
        assert run_until_idle(app, timeout=10) == 8
        assert sorted(seen) == list(range(8))
    finally:
        app.close()


def test_leaves_a_schedule_run_waiting_while_the_default_queue_is_paused(
    sync_app: drumbeat.App, caplog: pytest.LogCaptureFixture
) -> None:
    @sync_app.task
    def report() -> None: ...

    sync_app.schedule("daily-report", report, every=86400)
    sync_app.pause_queue("default")
    sync_app.run_now("daily-report")
    with caplog.at_level("INFO", logger="drumbeat.worker"):
        assert run_until_idle(sync_app, timeout=5) == 0
    assert "1 jobs wait in paused queues" in caplog.text
    sync_app.resume_queue("default")
    assert run_until_idle(sync_app, timeout=5) == 1


def test_runs_a_schedule_already_due_once_and_not_its_later_runs(sync_app: drumbeat.App) -> None:
    seen: list[float] = []

    @sync_app.task
    def tick() -> None:
        seen.append(time.time())

    sync_app.schedule("every-2s", tick, every=2)
    info = sync_app.get_schedule("every-2s")
    assert info is not None and info.next_due_ms is not None
    # No worker runs meanwhile: the run waits in its slot, due, when run_until_idle starts.
    time.sleep(max(0.0, info.next_due_ms / 1000 - time.time()) + 0.2)
    started = time.monotonic()
    assert run_until_idle(sync_app, timeout=10) == 1
    assert time.monotonic() - started < 1.5, "it waited for the next run, 2 s later"
    assert len(seen) == 1


def test_returns_with_a_schedule_due_every_second(sync_app: drumbeat.App) -> None:
    """A schedule is due within any timeout for ever: its run made due now is run, and the
    periodic ones after it do not keep run_until_idle from returning."""
    seen: list[float] = []

    @sync_app.task
    async def beat() -> None:
        seen.append(time.time())

    sync_app.schedule("heartbeat", beat, every=1)
    sync_app.run_now("heartbeat")
    started = time.monotonic()
    assert run_until_idle(sync_app, timeout=5) in {1, 2}  # one more if its slot came meanwhile
    assert time.monotonic() - started < 3
    assert 1 <= len(seen) <= 2


async def test_counts_runs_due_at_the_start_and_run_now_ones_not_later_periodic_ones(
    app: drumbeat.App,
) -> None:
    """What run_until_idle waits for, read by its `Reader` (no worker runs, so nothing is
    claimed): a run made due by run_now after the first read counts; a periodic run that
    came due after it does not."""

    @app.task
    def tick() -> None: ...

    await app.aschedule("every-2s", tick, every=2)
    await app.aschedule("weekly", tick, every=7 * 86400)
    client = await app.aredis()
    reader = Reader(Worker(app))
    assert (await reader.read(client, 0)).schedule_runs == 0  # the cutoff: now
    info = await app.aget_schedule("every-2s")
    assert info is not None and info.next_due_ms is not None
    await asyncio.sleep(max(0.0, info.next_due_ms / 1000 - time.time()) + 0.2)
    assert await app.arun_now("weekly") == 1
    # A due slot the last read did not list counts one run until the next read looks into it.
    await reader.read(client, 0)
    left = await reader.read(client, 0)
    assert left.schedule_runs == 1, "the run made due by run_now, not the periodic one"
    assert not left.idle
    assert "1 schedule runs due" in str(left)


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


async def test_the_last_settle_ends_the_wait_not_the_next_poll(app: drumbeat.App) -> None:
    """Once the worker lets go of its last claim (its outcome settled), the work is read again
    at once: with the poll an hour off, the call still returns when the job is done."""
    go = asyncio.Event()

    @app.task
    async def held() -> None:
        await go.wait()

    await held.aenqueue()
    worker = Worker(app)
    idle = asyncio.create_task(until_idle(worker, wait=None, timeout=60, poll=3600))
    # Running: until_idle has read it pending (queued, then running) and waits for its poll.
    await wait_for_async(lambda: worker.table.running, message="the job should start")
    go.set()
    assert await asyncio.wait_for(idle, 30) == 1


async def test_a_backlog_is_read_again_once_it_is_all_claimed_not_after_each_run(
    app: drumbeat.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At concurrency 1 the claim table empties between most two runs (a settle's reply before
    the next claim's): the work left is read again only once the worker has started as many
    runs as the last read found waiting, not after each run (40 jobs read about 30 times)."""
    reads = 0
    read = Reader.read

    async def counted(self: Reader, *args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await read(self, *args, **kwargs)

    monkeypatch.setattr(Reader, "read", counted)

    @app.task
    async def noop(i: int) -> None: ...

    await app.aenqueue_many([noop.prepare(i) for i in range(40)])
    worker = Worker(app, concurrency=1)
    assert await asyncio.wait_for(until_idle(worker, wait=None, timeout=60, poll=3600), 30) == 40
    assert reads <= 5, f"{reads} reads of what is left for 40 runs"


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


def test_burst_worker_runs_a_schedule_run_made_due_by_run_now(
    redis_url: str, namespace: str
) -> None:
    env = {**os.environ, "DRUMBEAT_REDIS_URL": redis_url, "DRUMBEAT_TEST_NAMESPACE": namespace}
    producer = drumbeat.App(redis_url, namespace=namespace)
    try:

        @producer.task(name="add")  # the name tests.apps.cli_app's worker knows
        def add(a: int, b: int = 0) -> int: ...

        producer.schedule("sums", add, every=86400, args=[1, 2])
        assert producer.run_now("sums") == 1
        proc = subprocess.run(
            [sys.executable, "-m", "drumbeat", "worker", "tests.apps.cli_app:app", "--burst"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "after 1 runs" in proc.stderr, proc.stderr
        info = producer.get_schedule("sums")
        assert info is not None and info.runs == 1
    finally:
        producer.close()


def test_burst_refuses_several_processes() -> None:
    result = CliRunner().invoke(
        cli, ["worker", "tests.apps.cli_app:app", "--burst", "--processes", "2"]
    )
    assert result.exit_code == USAGE_ERROR, result.output
    assert "--burst runs one worker process" in result.output
