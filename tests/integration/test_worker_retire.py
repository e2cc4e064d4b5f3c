"""`Worker.retire` (SIGUSR1 under a supervisor that scales down): no more claims, every running
job finished however long it takes (nothing handed back, checkpoints included), then exit; a
SIGTERM meanwhile turns it into a graceful stop with the usual grace."""

from __future__ import annotations

import asyncio
import signal

import drumbeat
from tests.helpers import wait_for_async


async def test_a_retiring_worker_finishes_its_jobs_past_the_grace_and_claims_no_more(
    redis_url: str, namespace: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, shutdown_grace=0.2)
    started: list[str] = []

    @app.task(name="t.slow")
    async def slow(n: int) -> int:
        started.append(f"slow{n}")
        await asyncio.sleep(1.0)  # five times the grace
        return n

    @app.task(name="t.steps")
    async def steps(n: int) -> int:
        started.append(f"steps{n}")
        for _ in range(10):
            await asyncio.sleep(0.1)
            await drumbeat.acheckpoint({"n": n})  # a stopping worker would hand it back here
        return n

    try:
        worker = drumbeat.Worker(app, concurrency=2)
        task = asyncio.create_task(worker.run())
        jobs = [await app.aenqueue("t.slow", 1), await app.aenqueue("t.steps", 2)]
        await wait_for_async(lambda: len(started), until=lambda n: n == 2,
                             message="both jobs should start")  # fmt: skip
        worker.retire()
        later = await app.aenqueue("t.slow", 3)
        await asyncio.wait_for(task, 30)
        assert [await j.aresult(timeout=5) for j in jobs] == [1, 2]
        assert started == ["slow1", "steps2"], "each ran once, and nothing after the retire"
        assert await later.astatus() is drumbeat.JobStatus.QUEUED
        assert worker.processed == 2
    finally:
        await app.aclose()


async def test_sigterm_while_retiring_gives_the_running_jobs_the_grace_then_hands_back(
    redis_url: str, namespace: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, shutdown_grace=0.3)
    ticks: list[float] = []

    @app.task(name="t.stuck")
    async def stuck() -> None:
        while True:  # runs until cancelled
            ticks.append(asyncio.get_running_loop().time())
            await asyncio.sleep(0.05)

    try:
        worker = drumbeat.Worker(app, concurrency=1)
        task = asyncio.create_task(worker.run())
        job = await app.aenqueue("t.stuck")
        await wait_for_async(job.astatus, until=lambda s: s is drumbeat.JobStatus.RUNNING,
                             message="the job should run")  # fmt: skip
        worker.retire()
        past_grace = asyncio.get_running_loop().time() + 2 * 0.3
        await wait_for_async(
            lambda: ticks[-1],
            until=lambda t: t > past_grace,
            message="a retiring worker should let its job run past the grace",
        )
        assert not task.done()
        worker._on_signal(signal.SIGTERM)
        await asyncio.wait_for(task, 10)
        assert await job.astatus() is drumbeat.JobStatus.QUEUED, "handed back after the grace"
    finally:
        await app.aclose()
