"""`Settings.job_shards`: jobs spread over several shards (hash tags: several Cluster masters),
each job's id naming its shard, and everything a job system does still working across them."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator

import pytest
import redis

import drumbeat
from drumbeat import admin, autoscale
from drumbeat.job_ids import job_shard_of
from drumbeat.testing import arun_until_idle
from tests.conftest import running_worker
from tests.helpers import leased, wait_for_async

SHARDS = 3


@pytest.fixture
async def sharded(redis_url: str, namespace: str) -> AsyncIterator[drumbeat.App]:
    app = drumbeat.App(
        redis_url, namespace=namespace, job_shards=SHARDS, idle_block=0.5, lease=2.0,
        maintenance_interval=0.1, progress_interval=0.0,
    )  # fmt: skip
    yield app
    await app.aclose()


def key_in_shard(shard: int, prefix: str = "k") -> str:
    """A dedup key that hashes to job shard ``shard``."""
    return next(
        f"{prefix}{i}" for i in range(1000) if zlib.crc32(f"{prefix}{i}".encode()) % SHARDS == shard
    )


async def test_jobs_spread_over_the_shards_and_each_is_found_by_its_id(
    sharded: drumbeat.App, r: redis.Redis
) -> None:
    @sharded.task
    async def double(n: int) -> int:
        return 2 * n

    jobs = [await double.aenqueue(n) for n in range(12)]
    shards = [job_shard_of(job.id) for job in jobs]
    assert set(shards) == set(range(SHARDS)), f"enqueues took turns over the shards: {shards}"
    for k, keys in enumerate(sharded.job_keys):
        assert r.zcard(keys.ready) == shards.count(k), f"shard {k} holds its own jobs"
    assert len({keys.tag for keys in sharded.job_keys}) == SHARDS, "one hash tag per shard"
    assert admin.queue_stats(sharded).ready == 12, "status counts every shard"
    assert sum(autoscale.read_signal(sharded).ready_by_priority) == 12, "so does the autoscaler"
    assert {await job.astatus() for job in jobs} == {"queued"}
    async with running_worker(sharded, concurrency=4):
        assert [await job.aresult(timeout=20) for job in jobs] == [2 * n for n in range(12)]
    assert {await job.astatus() for job in jobs} == {"complete"}
    batch = await sharded.aenqueue_many([double.prepare(n) for n in range(5)])
    assert len({job_shard_of(job.id) for job in batch}) == 1, "a small batch stays in one shard"


async def test_a_dedup_key_and_a_limit_pin_the_shard(sharded: drumbeat.App) -> None:
    @sharded.task
    async def once(n: int) -> None: ...

    @sharded.task(concurrency_limit=1)
    async def limited(n: int) -> None: ...

    key = key_in_shard(2)
    first = await once.options(key=key).aenqueue(1)
    again = [await once.options(key=key).aenqueue(n) for n in range(4)]
    assert job_shard_of(first.id) == 2
    assert {job.id for job in again} == {first.id}, "a dedup key dedupes in one shard"
    assert not any(job.created for job in again)
    shards = {job_shard_of((await limited.aenqueue(n)).id) for n in range(6)}
    assert shards == {0}, "limited jobs live in the main shard, with their limiter keys"


async def test_a_batch_of_keyed_jobs_goes_in_one_call_per_shard_in_the_order_given(
    sharded: drumbeat.App,
) -> None:
    """Keys hash their jobs to every shard in turn; the batch still makes one call per shard
    (not one per change of shard), and each job comes back at its place."""

    @sharded.task
    async def once(n: int) -> None: ...

    keys = [f"order{n}" for n in range(30)]
    calls, _ = sharded.enqueuer.calls([once.options(key=k).prepare(n) for n, k in enumerate(keys)])
    assert len(calls) == SHARDS, f"{len(calls)} calls for 30 keyed jobs over {SHARDS} shards"
    first = await sharded.aenqueue_many([once.options(key=k).prepare(1) for k in keys])
    assert [job_shard_of(job.id) for job in first] == [
        zlib.crc32(k.encode()) % SHARDS for k in keys
    ], "each job at the place of its key"
    again = await sharded.aenqueue_many([once.options(key=k).prepare(2) for k in reversed(keys)])
    assert [job.id for job in again] == [job.id for job in reversed(first)]
    assert not any(job.created for job in again)


async def test_dead_letters_retry_purge_and_cancel_across_shards(sharded: drumbeat.App) -> None:
    @sharded.task
    async def fail(n: int) -> None:
        raise ValueError(f"bad {n}")

    @sharded.task
    async def later() -> None: ...

    failing = [await fail.aenqueue(n) for n in range(6)]
    assert len({job_shard_of(job.id) for job in failing}) == SHARDS
    assert await arun_until_idle(sharded, concurrency=4) == 6
    assert admin.dead_count(sharded) == 6, "every failed job is dead-lettered"
    listed = admin.dead_letters(sharded, limit=10)
    assert {d.id for d in listed} == {job.id for job in failing}
    assert [d.died_ms for d in listed] == sorted((d.died_ms for d in listed), reverse=True)
    assert admin.dead_letters(sharded, limit=4) == listed[:4], "the newest over all shards"
    assert admin.retry_dead(sharded, None).jobs == 6, "every shard's dead letters requeued"
    assert await arun_until_idle(sharded, concurrency=4) == 6
    assert admin.dead_count(sharded) == 6, "they fail again"
    in_two = [j.id for j in failing if job_shard_of(j.id) == 2]
    assert admin.purge_dead(sharded, in_two) == len(in_two), "purged in the shard each id names"
    assert admin.purge_dead(sharded, None) == 6 - len(in_two)
    assert admin.dead_count(sharded) == 0
    waiting = [await later.options(delay=60).aenqueue() for _ in range(SHARDS)]
    assert len({job_shard_of(job.id) for job in waiting}) > 1
    assert [await job.acancel() for job in waiting] == [True] * SHARDS
    assert {await job.astatus() for job in waiting} == {"cancelled"}


async def test_a_checkpoint_lends_its_slot_to_an_urgent_job_of_another_shard(
    sharded: drumbeat.App,
) -> None:
    """The busy worker hears of the urgent job on that shard's channel, and claims it there."""
    done: list[str] = []

    @sharded.task(priority=0)
    async def crawl(pages: int) -> int:
        for n in range(pages):
            await asyncio.sleep(0.02)
            done.append(f"page{n}")
            await drumbeat.acheckpoint(progress=n + 1)
        return pages

    @sharded.task(priority=9)
    async def urgent() -> None:
        done.append("urgent")

    async with running_worker(sharded, concurrency=1) as worker:
        job = await crawl.options(key=key_in_shard(0, "crawl")).aenqueue(60)
        await wait_for_async(lambda: worker.signals.subscribed.is_set() and len(done) >= 2,
                             message="crawl should start")  # fmt: skip
        hurry = await urgent.options(key=key_in_shard(2, "urgent")).aenqueue()
        assert (job_shard_of(job.id), job_shard_of(hurry.id)) == (0, 2)
        await hurry.aresult(timeout=10)
        assert len(done) < 61 and "urgent" in done
        assert done.index("urgent") < 60, "the urgent job ran while the crawl was paused"
        assert await job.aresult(timeout=30) == 60
        assert await job.aprogress() is None


async def test_a_run_lost_with_its_worker_comes_back_in_its_own_shard(
    sharded: drumbeat.App, r: redis.Redis
) -> None:
    """A lease that lapses in a job shard is reaped there: the job runs again."""
    ran: list[int] = []

    @sharded.task
    async def work(n: int) -> int:
        ran.append(n)
        return n

    job = await work.options(key=key_in_shard(1, "lost")).aenqueue(7)
    keys, scripts = sharded.job_shard(job.id)
    [claimed] = scripts.claim("a-worker-that-dies", 1, 500, 10).run(r).jobs  # lease: 0.5 s
    assert claimed.id == job.id
    async with running_worker(sharded, concurrency=1):
        assert await job.aresult(timeout=20) == 7
    assert ran == [7]
    assert leased(r, keys.leases) == 0
