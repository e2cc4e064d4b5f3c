"""Pausing a queue (`App.pause_queue`): its jobs and schedule runs wait, in order, while other
queues run; running ones finish; the state is in Redis, for every worker and every shard; a
resume wakes idle workers; `run_until_idle` does not wait for a paused queue's jobs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

import drumbeat
from drumbeat.testing import run_until_idle
from tests.conftest import RedisServer, running_worker
from tests.helpers import commands, wait_for_async


@pytest.fixture
def sync_app(redis_url: str, namespace: str) -> Iterator[drumbeat.App]:
    app = drumbeat.App(redis_url, namespace=namespace, idle_block=0.5)
    yield app
    app.close()


@pytest.fixture
async def async_app(redis_url: str, namespace: str) -> AsyncIterator[drumbeat.App]:
    app = drumbeat.App(redis_url, namespace=namespace, idle_block=0.5)
    yield app
    await app.aclose()


def test_a_paused_queues_jobs_wait_while_other_queues_run(sync_app: drumbeat.App) -> None:
    ran: list[str] = []

    @sync_app.task(queue="builds")
    def build(n: int) -> None:
        ran.append(f"build {n}")

    @sync_app.task
    def mail(n: int) -> None:
        ran.append(f"mail {n}")

    assert sync_app.pause_queue("builds") is True
    assert sync_app.pause_queue("builds") is False  # already
    assert sync_app.paused_queues() == ["builds"]
    builds = [build.enqueue(i) for i in range(3)]  # accepted while paused
    mails = [mail.enqueue(i) for i in range(2)]
    # Idle once the default queue is done: a paused queue's jobs are not pending.
    assert run_until_idle(sync_app, timeout=10) == 2
    assert sorted(ran) == ["mail 0", "mail 1"]
    assert [j.status() for j in mails] == ["complete"] * 2
    assert [j.status() for j in builds] == ["queued"] * 3

    assert sync_app.resume_queue("builds") is True
    assert sync_app.resume_queue("builds") is False
    assert sync_app.paused_queues() == []
    assert run_until_idle(sync_app, timeout=10) == 3
    assert [j.status() for j in builds] == ["complete"] * 3


def test_order_and_priority_are_kept_and_delayed_jobs_become_ready(
    sync_app: drumbeat.App, r: redis.Redis
) -> None:
    ran: list[str] = []

    @sync_app.task
    def step(name: str) -> None:
        ran.append(name)

    @sync_app.task(queue="other")
    def probe() -> None: ...

    sync_app.pause_queue("default")
    for name, priority in [("a0", 0), ("b5", 5), ("c0", 0), ("d9", 9), ("e5", 5)]:
        step.options(priority=priority).enqueue(name)
    delayed = step.options(delay=0.2, priority=5).enqueue("f5-delayed")
    time.sleep(0.3)  # due now
    probe.enqueue()
    # The claim that takes the probe moves the due job into `ready`, and takes nothing else.
    assert run_until_idle(sync_app, concurrency=1, timeout=10) == 1
    assert r.zscore(sync_app.keys.ready, delayed.id) is not None
    assert r.zscore(sync_app.keys.due, delayed.id) is None
    assert ran == []

    sync_app.resume_queue("default")
    assert run_until_idle(sync_app, concurrency=1, timeout=10, queues=["default"]) == 6
    assert ran == ["d9", "b5", "e5", "f5-delayed", "a0", "c0"]


async def test_a_running_job_finishes_and_its_retry_waits(async_app: drumbeat.App) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    attempts: list[int] = []

    @async_app.task(retries=1, backoff=0.01)
    async def slow(fail: bool) -> str:
        attempts.append(1)
        started.set()
        await release.wait()
        if fail and len(attempts) == 1:
            raise RuntimeError("once")
        return "done"

    @async_app.task(queue="other")
    async def probe() -> str:
        return "probed"

    first = await slow.aenqueue(True)
    async with running_worker(async_app, concurrency=2, queues=["default", "other"]):
        await asyncio.wait_for(started.wait(), 10)
        await async_app.apause_queue("default")
        waiting = await slow.aenqueue(False)
        release.set()
        # The run under way ends (it fails once: its retry goes back to the queue and waits).
        await wait_for_async(first.astatus, lambda s: s != "running",
                             message="the running job settled")  # fmt: skip
        # A job of another queue runs after that: the worker claimed meanwhile, and took
        # nothing of the paused queue.
        assert await (await probe.aenqueue()).aresult(timeout=10) == "probed"
        assert await first.astatus() in ("queued", "delayed")
        assert await waiting.astatus() == "queued"
        assert len(attempts) == 1

        await async_app.aresume_queue("default")
        assert await first.aresult(timeout=10) == "done"
        assert await waiting.aresult(timeout=10) == "done"
    assert await async_app.apaused_queues() == []


async def test_resuming_wakes_an_idle_worker_at_once(redis_url: str, namespace: str) -> None:
    # An idle block far beyond the wait below: only the resume's wake marker can start the job.
    app = drumbeat.App(redis_url, namespace=namespace, idle_block=60)

    @app.task
    async def hello() -> str:
        return "hi"

    try:
        await app.apause_queue("default")
        async with running_worker(app):
            job = await hello.aenqueue()  # wakes the worker, whose claim takes nothing
            await asyncio.sleep(0.3)
            assert await job.astatus() == "queued"
            await app.aresume_queue("default")
            assert await job.aresult(timeout=10) == "hi"
    finally:
        await app.aclose()


def test_the_pause_holds_for_a_worker_started_after_it_on_every_shard(
    redis_url: str, namespace: str
) -> None:
    def make() -> drumbeat.App:
        app = drumbeat.App(redis_url, namespace=namespace, job_shards=3, schedule_shards=2)

        @app.task(name="build", queue="builds")
        def build() -> None: ...

        return app

    pausing, later = make(), make()
    try:
        pausing.pause_queue("builds")
        jobs = [later.enqueue("build") for _ in range(6)]
        assert len({job.id.partition(".")[2] for job in jobs}) > 1  # spread over job shards
        for k in [*later.job_keys, *later.scheduler.apart]:  # a copy in every shard
            assert set(later.redis.smembers(k.pauses)) == {b"builds"}  # a list on redis-py 5
        # A worker of another App object (as another process would be): it claims nothing.
        assert run_until_idle(later, timeout=10) == 0
        assert later.paused_queues() == ["builds"]
        assert {job.status() for job in jobs} == {"queued"}
        later.resume_queue("builds")
        for k in [*later.job_keys, *later.scheduler.apart]:
            assert not later.redis.smembers(k.pauses)
        assert run_until_idle(later, timeout=10) == 6
    finally:
        pausing.close()
        later.close()


def test_lending_passes_over_a_paused_queue(sync_app: drumbeat.App, r: redis.Redis) -> None:
    @sync_app.task(queue="builds", priority=9)
    def urgent() -> None: ...

    urgent.enqueue()
    sync_app.pause_queue("builds")
    lent = sync_app.scripts.claim_urgent("w", 1, 60_000, queues=["default", "builds"]).run(r)
    assert (lent.jobs, lent.best) == ([], -1)
    sync_app.resume_queue("builds")
    lent = sync_app.scripts.claim_urgent("w", 1, 60_000, queues=["default", "builds"]).run(r)
    assert len(lent.jobs) == 1


def test_a_queue_name_is_checked(sync_app: drumbeat.App) -> None:
    with pytest.raises(ValueError, match="queue name 'a b'"):
        sync_app.pause_queue("a b")


async def test_schedule_runs_of_a_paused_default_queue_wait_then_resume(
    redis_url: str, namespace: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, idle_block=0.5, min_interval=0.05)
    runs: list[float] = []

    @app.task
    async def tick() -> None:
        runs.append(time.monotonic())

    try:
        await app.aschedule("tick", tick, every=0.1)
        async with running_worker(app, concurrency=2):
            await wait_for_async(lambda: len(runs), lambda n: n >= 2, message="runs before")
            await app.apause_queue("default")
            await asyncio.sleep(0.5)  # a run claimed before the pause took effect finishes
            before = len(runs)
            await asyncio.sleep(1.0)  # ten intervals
            assert len(runs) == before, "a schedule run started while default was paused"
            await app.aresume_queue("default")
            await wait_for_async(lambda: len(runs), lambda n: n >= before + 2,
                                 message="runs after the resume")  # fmt: skip
    finally:
        await app.aclose()


async def test_an_idle_worker_does_not_spin_on_a_paused_queues_jobs(
    own_redis: RedisServer, own_r: redis.Redis, namespace: str
) -> None:
    """A paused queue's jobs re-arm no wake marker and its due times bound no wait, so a worker
    with nothing else to do claims about once per idle block (0.5 s), not in a loop."""

    app = drumbeat.App(own_redis.url, namespace=namespace, idle_block=0.5)

    @app.task(queue="builds")
    async def build() -> None: ...

    try:
        await app.apause_queue("builds")
        await build.aenqueue()
        await build.options(delay=0.05).aenqueue()
        async with running_worker(app, queues=["builds"]):
            await asyncio.sleep(0.2)
            before = commands(own_r, "evalsha")
            await asyncio.sleep(1.0)
            calls = commands(own_r, "evalsha") - before
        # Two idle waits' claims, a few reaps and heartbeats; a spinning worker claims
        # thousands of times.
        assert calls < 50, calls
        assert own_r.zcard(app.keys.ready_of("builds")) == 2  # the delayed one moved in
    finally:
        await app.aclose()
