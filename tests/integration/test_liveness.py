"""A worker is wedged once every thread of its task pool runs a sync task it gave up on, and
no longer once one of them returns."""

from __future__ import annotations

import threading

import pytest

import drumbeat
from tests.conftest import running_worker
from tests.helpers import wait_for_async


async def test_a_worker_is_wedged_while_every_task_thread_runs_past_its_timeout(
    app: drumbeat.App,
) -> None:
    release = threading.Event()

    @app.task(timeout=0.1, retries=0)
    def stuck() -> None:
        release.wait(30)

    try:
        async with running_worker(app, concurrency=1) as worker:
            jobs = [await stuck.aenqueue() for _ in range(worker.threads - 1)]
            for job in jobs:
                with pytest.raises(drumbeat.JobFailed, match="timed out"):
                    await job.aresult(timeout=10)
            assert worker.runner.abandoned == worker.threads - 1
            assert worker.wedged() is None, "a thread is left: a sync job can still start"
            with pytest.raises(drumbeat.JobFailed, match="timed out"):
                await (await stuck.aenqueue()).aresult(timeout=10)
            assert worker.wedged() is not None, f"all {worker.threads} threads are stuck"
            release.set()
            await wait_for_async(lambda: worker.runner.abandoned, until=lambda n: n == 0,
                                 message="the stuck threads returned")  # fmt: skip
            assert worker.wedged() is None
    finally:
        release.set()
