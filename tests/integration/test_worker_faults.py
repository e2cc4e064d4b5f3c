"""The worker's own faults: claims of one job told apart by token, bugs in running or settling
that must not leave a lease renewed forever, parts that crash, and the hook seam."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

import drumbeat
from drumbeat.worker import Hooks, JobEnd
from tests.conftest import reap_call, running_worker
from tests.helpers import wait_for_async


@pytest.fixture
async def quick(redis_url: str, namespace: str) -> AsyncIterator[drumbeat.App]:
    """An app whose leases lapse and get reaped within a second or two."""
    app = drumbeat.App(
        redis_url, namespace=namespace, lease=1.0, max_stalls=1, maintenance_interval=0.1,
        idle_block=0.5, shutdown_grace=1.0,
    )  # fmt: skip
    yield app
    await app.aclose()


async def test_a_job_claimed_again_while_its_first_claim_runs_keeps_its_lease(
    quick: drumbeat.App, r: redis.Redis
) -> None:
    """The first claim's lease is taken over (expired and reaped) while it still runs here, and
    this same worker claims the job again. Keyed by id alone, the first run's end freed the
    second's slot and its refused ack forgot the second claim, whose lease then lapsed (the
    job was dead-lettered while it ran); a late "lease lost" for the old token cancelled the
    new run."""
    starts: list[int] = []

    @quick.task
    async def long() -> str:
        attempt = drumbeat.current_job().attempt
        starts.append(attempt)
        await asyncio.sleep(1.0 if attempt == 1 else 3.0)  # the second outlives two leases
        return f"attempt {attempt}"

    job = await long.aenqueue()
    async with running_worker(quick, concurrency=2):
        await wait_for_async(
            lambda: starts == [1], message="the first attempt did not start", timeout=10
        )
        # The first claim's lease runs out and is reaped: the job is back in `ready`.
        r.zadd(quick.keys.leases, {job.id: 0})
        assert reap_call(quick, max_stalls=1).run(r).requeued == 1
        assert await job.aresult(timeout=15) == "attempt 2"
    assert starts == [1, 2]


async def test_a_retry_with_an_unusable_delay_is_a_clear_error(app: drumbeat.App) -> None:
    """`Retry(delay=inf)` used to raise out of the runner (``round(inf)``), leaving the lease
    renewed for ever; now the request itself is refused, and the task fails with why."""

    @app.task
    async def broken() -> None:
        raise drumbeat.Retry(delay=float("inf"))

    async with running_worker(app):
        with pytest.raises(drumbeat.JobFailed, match="delay must be a number of seconds"):
            await (await broken.aenqueue()).aresult(timeout=10)


async def test_an_exception_out_of_the_runner_lets_the_lease_lapse(
    quick: drumbeat.App, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever goes wrong inside the worker while running a job (here: a fault injected into
    the runner), the claim is released: its lease lapses, the reaper requeues the job and, past
    `max_stalls`, dead-letters it. It is never left 'running' with nothing running it."""

    @quick.task
    async def fine() -> str:
        return "ok"

    job = await fine.aenqueue()
    async with running_worker(quick) as worker:
        real = worker.runner.run

        async def broken_run(claimed: Any, *args: Any) -> Any:
            if claimed.id == job.id:
                raise RuntimeError("a bug in the runner")
            return await real(claimed, *args)

        worker.runner.run = broken_run  # type: ignore[method-assign]

        async def ended() -> bool:
            return await job.astatus() is drumbeat.JobStatus.DEAD

        await wait_for_async(
            ended, message="never dead-lettered: its lease was renewed for ever", timeout=15
        )
        assert f"running job {job.id} failed inside the worker" in caplog.text
        assert await (await fine.aenqueue()).aresult(timeout=10) == "ok", "the worker stopped"


async def test_an_error_text_the_codec_cannot_encode_is_dead_lettered_readably(
    app: drumbeat.App,
) -> None:
    """A lone surrogate in an error message cannot be encoded as UTF-8 JSON; the failure record
    used to raise out of the runner and the job's lease was renewed for ever."""

    @app.task
    async def odd() -> None:
        raise ValueError("bad \ud800 text")

    job = await odd.aenqueue()
    async with running_worker(app):
        with pytest.raises(drumbeat.JobFailed) as failed:
            await job.aresult(timeout=10)
    assert "bad \\ud800 text" in failed.value.error


async def test_a_bug_in_settling_lets_the_leases_go_and_the_flusher_goes_on(
    app: drumbeat.App, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task
    async def work(n: int) -> int:
        return n

    async with running_worker(app) as worker:
        real = worker.settler._calls
        broken = [True]

        def calls(batch: Any) -> Any:
            if broken:
                broken.clear()
                raise RuntimeError("a bug in settling")
            return real(batch)

        worker.settler._calls = calls  # type: ignore[method-assign]
        first = await work.aenqueue(1)
        await wait_for_async(
            lambda: not broken and not worker.table.owned(),
            message="the claim of the unsettled job was still held",
            timeout=10,
        )
        assert "settling 1 jobs failed" in caplog.text
        assert r.zscore(app.keys.leases, first.id) is not None, "left to lapse for the reaper"
        assert await (await work.aenqueue(2)).aresult(timeout=10) == 2, "the flusher died"


async def test_a_part_that_keeps_crashing_stops_the_worker(
    app: drumbeat.App, r: redis.Redis
) -> None:
    worker = drumbeat.Worker(app)
    crashes: list[float] = []

    async def crash(client: Any) -> None:
        crashes.append(time.monotonic())
        raise RuntimeError("a bug in housekeeping")

    worker.housekeeper.run = crash  # type: ignore[method-assign]
    with pytest.raises(drumbeat.WorkerCrashed, match="housekeeping crashed 5 times"):
        await asyncio.wait_for(worker.run(), 30)
    assert len(crashes) == 5, "restarted with backoff, then gave up"
    assert crashes[-1] - crashes[0] >= 0.1 + 0.2 + 0.4 + 0.8 - 0.05, "restarts had no backoff"
    assert r.zscore(app.keys.workers, worker.id) is None, "a crashed worker deregisters"
    assert not worker.heartbeat.alive


async def test_hooks_see_the_process_and_every_job(app: drumbeat.App) -> None:
    seen: list[Any] = []

    @app.task
    async def ok() -> None:
        await asyncio.sleep(0.05)

    @app.task
    async def bad() -> None:
        raise ValueError("no")

    async def after(end: JobEnd) -> None:
        seen.append((end.outcome, end.duration >= 0.05 if end.outcome == "done" else None))

    def broken_hook(job: Any) -> None:
        raise RuntimeError("a hook bug must not break the job")

    hooks = Hooks(
        on_start=[lambda: seen.append("start")],
        on_stop=[lambda: seen.append("stop")],
        before_job=[broken_hook, lambda job: seen.append(("before", job.id))],
        after_job=[after],
    )
    a, b = await ok.aenqueue(), await bad.aenqueue()
    worker = drumbeat.Worker(app, hooks=hooks)
    task = asyncio.create_task(worker.run())
    assert await a.aresult(timeout=10) is None
    with pytest.raises(drumbeat.JobFailed):
        await b.aresult(timeout=10)
    worker.stop()
    await asyncio.wait_for(task, 10)
    assert seen[0] == "start" and seen[-1] == "stop"
    assert {s for s in seen if isinstance(s, tuple) and s[0] == "before"} == {
        ("before", a.id),
        ("before", b.id),
    }
    assert ("done", True) in seen and ("dead", None) in seen


async def test_a_failing_start_hook_stops_the_worker_before_it_claims(
    app: drumbeat.App, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task
    async def ok() -> None:
        pass

    def no_database() -> None:
        raise ConnectionRefusedError("database is down")

    job = await ok.aenqueue()
    worker = drumbeat.Worker(app, hooks=Hooks(on_start=[no_database]))
    with caplog.at_level(logging.INFO), pytest.raises(ConnectionRefusedError):
        await asyncio.wait_for(worker.run(), 10)
    assert await job.astatus() is drumbeat.JobStatus.QUEUED, "it claimed without its resources"
    assert r.zscore(app.keys.workers, worker.id) is None


async def test_a_connection_lost_while_the_worker_starts_is_waited_out(
    app: drumbeat.App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Its start-up steps (the server check, moving an older version's timing wheel) talk to
    # Redis before the claim loop's retries apply: a cut connection there stopped the worker.
    from drumbeat.worker import process

    moves: list[int] = []
    real_move = process.move_wheel

    def cut_once(*args: Any) -> Any:
        moves.append(1)
        if len(moves) == 1:
            raise redis.ConnectionError("Connection closed by server.")
        return real_move(*args)

    monkeypatch.setattr(process, "move_wheel", cut_once)

    @app.task
    async def echo(n: int) -> int:
        return n

    job = await echo.aenqueue(7)
    async with running_worker(app):
        assert await job.aresult(timeout=10) == 7
    assert len(moves) == 2, "tried again after the cut"
    assert "moving the timing wheel failed (ConnectionError" in caplog.text
