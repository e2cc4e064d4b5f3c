"""`drumbeat.admin` against a real redis-server: queue stats, dead-letter listing, retry, purge."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime

import pytest
import redis

import drumbeat
from drumbeat import admin
from drumbeat.job import encode_failure, encode_spec
from drumbeat.protocol import ready_score
from drumbeat.scripts import Call
from drumbeat.serialization import CODECS
from tests.conftest import running_worker


def _now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def _wait_for(
    predicate: Callable[[], Awaitable[bool]], what: str, timeout: float = 5.0
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
async def small_batches(redis_url: str, namespace: str) -> AsyncIterator[drumbeat.App]:
    """An app on the test's namespace whose scripts handle two items per call."""
    a = drumbeat.App(redis_url, namespace=namespace, batch_limit=2)
    yield a
    await a.aclose()


# -- queue_stats -------------------------------------------------------------------------------


async def test_depth_per_priority_and_delayed(app: drumbeat.App) -> None:
    jobs = [
        drumbeat.Prepared("t.x", [], {}, drumbeat.Options(priority=p)) for p in (0, 3, 3, 9, 9, 9)
    ]
    jobs.append(drumbeat.Prepared("t.x", [], {}, drumbeat.Options(priority=5, delay=60)))
    await app.aenqueue_many(jobs)

    stats = admin.queue_stats(app)
    assert stats.ready_by_priority == (1, 0, 0, 2, 0, 0, 0, 0, 0, 3)
    assert stats.ready == 6
    assert stats.delayed == 1
    assert (stats.running_total, stats.running, stats.dead) == (0, (), 0)
    assert (stats.workers, stats.stale_workers) == ((), 0)
    assert abs(stats.now_ms - _now_ms(app.redis)) < 5000


async def test_priority_levels_split_exactly_at_their_score_bounds(app: drumbeat.App) -> None:
    span = admin.PRIORITY_SPAN
    # priority p owns scores [(9 - p) * span, (10 - p) * span)
    app.redis.zadd(
        app.keys.ready,
        {
            "p5-first": 4 * span,
            "p5-last": 5 * span - 1,
            "p4-first": 5 * span,
            "p0-last": 10 * span - 1,
            "p9-first": 0,
        },
    )
    stats = admin.queue_stats(app)
    assert stats.ready_by_priority == (1, 0, 0, 0, 1, 2, 0, 0, 0, 1)


async def test_leases_are_read_against_redis_time(app: drumbeat.App) -> None:
    client = app.redis
    now = _now_ms(client)
    client.zadd(app.keys.leases, {"a": now + 5000, "b": now - 1000, "gone": now + 9000})
    client.hset(app.keys.owners, mapping={"a": f"7|w-1|{now - 2000}", "b": f"8|w-2|{now - 20000}"})

    stats = admin.queue_stats(app)
    assert stats.running_total == 3
    # closest to expiry first; "gone" has no owner any more (finished meanwhile), so not listed
    assert [(j.id, j.worker) for j in stats.running] == [("b", "w-2"), ("a", "w-1")]
    b, a = stats.running
    assert a.lease_age == pytest.approx(2.0, abs=1.0)
    assert a.lease_left == pytest.approx(5.0, abs=1.0)
    assert (a.claimed_ms, a.deadline_ms) == (now - 2000, now + 5000)
    assert b.lease_left < 0  # expired, not reaped yet

    assert len(admin.queue_stats(app, running_limit=1).running) == 1
    none = admin.queue_stats(app, running_limit=0)
    assert (none.running, none.running_total) == ((), 3)


async def test_running_jobs_and_live_workers_from_a_worker(app: drumbeat.App) -> None:
    release = asyncio.Event()

    async def hold(n: int) -> int:
        await release.wait()
        return n

    task = app.task(hold)
    jobs = [await task.aenqueue(i) for i in range(3)]
    client = await app.aredis()
    async with running_worker(app, concurrency=4) as worker:

        async def all_running() -> bool:
            return all([await j.astatus() is drumbeat.JobStatus.RUNNING for j in jobs])

        async def registered() -> bool:
            return await client.hexists(app.keys.workerinfo, worker.id)

        await _wait_for(all_running, "the jobs to run")
        await _wait_for(registered, "the worker's heartbeat")
        stats = await asyncio.to_thread(admin.queue_stats, app, 2)
        release.set()
        assert [await j.aresult(timeout=5) for j in jobs] == [0, 1, 2]

    assert stats.running_total == 3
    assert len(stats.running) == 2
    assert {j.id for j in stats.running} <= {j.id for j in jobs}
    for job in stats.running:
        assert job.worker == worker.id
        assert 0 <= job.lease_age < 5
        assert 0 < job.lease_left <= app.settings.lease
    (info,) = stats.workers
    assert info.id == worker.id
    assert (info.host, info.pid, info.concurrency) == (socket.gethostname(), os.getpid(), 4)
    assert info.processed == 0
    assert info.running is not None
    assert info.started_ms is not None
    assert 0 <= info.heartbeat_age < 5
    assert stats.stale_workers == 0

    after = admin.queue_stats(app)
    assert (after.running_total, after.workers) == (0, ())  # deregistered on stop


async def test_silent_and_unreadable_workers(app: drumbeat.App) -> None:
    client = app.redis
    now = _now_ms(client)
    silent_for = app.settings.lease_ms * admin.WORKER_TTL_LEASES + 1000
    client.zadd(app.keys.workers, {"old": now - silent_for, "odd": now - 1500, "bare": now})
    client.hset(app.keys.workerinfo, mapping={"old": b"{}", "odd": b"not json{"})

    stats = admin.queue_stats(app)
    assert stats.stale_workers == 1
    assert [w.id for w in stats.workers] == ["bare", "odd"]
    bare, odd = stats.workers
    assert (odd.host, odd.pid, odd.concurrency, odd.running, odd.processed) == (None,) * 5
    assert odd.heartbeat_age == pytest.approx(1.5, abs=1.0)
    assert bare.host is None


# -- dead letters ------------------------------------------------------------------------------


async def test_dead_letters_newest_first_whatever_their_records(app: drumbeat.App) -> None:
    client = app.redis
    json_codec, msgpack_codec = CODECS["json"], CODECS["msgpack"]
    spec = encode_spec(json_codec, "mod.fn", json_codec.dumps([[1], {}]))
    packed = encode_spec(msgpack_codec, "mod.packed", msgpack_codec.dumps([[], {"a": 1}]))
    client.zadd(app.keys.dead, {"old": 1_000, "mid": 2_000, "new": 3_000, "bare": 500})
    client.hset(app.keys.jobs, mapping={"old": spec, "mid": b"garbage", "new": packed})
    client.hset(
        app.keys.errors,
        mapping={
            "old": encode_failure(json_codec, "ValueError: no", "Traceback: here", 3, 1_000),
            # what reap.lua writes: cjson, no traceback, no "ok"
            "mid": json.dumps({"error": "lease expired 4 times", "attempt": 4, "stalls": 4}),
            "new": encode_failure(msgpack_codec, "KeyError: 'k'", None, 1, 3_000),
            "bare": b"\xc1 not a record",
        },
    )

    letters = admin.dead_letters(app)
    assert [d.id for d in letters] == ["new", "mid", "old", "bare"]
    new, mid, old, bare = letters
    assert (new.task, new.error, new.attempt, new.traceback) == (
        "mod.packed",
        "KeyError: 'k'",
        1,
        None,
    )
    assert (mid.task, mid.error, mid.attempt) == ("?", "lease expired 4 times", 4)
    assert (old.task, old.error, old.attempt, old.traceback) == (
        "mod.fn",
        "ValueError: no",
        3,
        "Traceback: here",
    )
    assert old.died_at == datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert (bare.task, bare.attempt) == ("?", None)
    assert bare.error.startswith("(unreadable error record)")

    assert [d.id for d in admin.dead_letters(app, limit=2)] == ["new", "mid"]
    assert admin.dead_letters(app, limit=0) == []
    assert admin.dead_count(app) == 4

    client.hdel(app.keys.errors, "new")
    assert admin.dead_letters(app, limit=1)[0].error == "(no error record)"


async def test_dead_letters_of_a_msgpack_worker(redis_url: str, namespace: str) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, codec="msgpack")
    try:

        @app.task(name="fails")
        def fails(x: int) -> None:
            raise RuntimeError(f"no {x}")

        job = await fails.aenqueue(7)
        async with running_worker(app):
            with pytest.raises(drumbeat.JobFailed):
                await job.aresult(timeout=10)
        (letter,) = admin.dead_letters(app)
        assert (letter.id, letter.task, letter.error, letter.attempt) == (
            job.id,
            "fails",
            "RuntimeError: no 7",
            1,
        )
        assert letter.traceback is not None
        assert "RuntimeError: no 7" in letter.traceback
    finally:
        await app.aclose()


async def _bury_unknown(app: drumbeat.App, n: int) -> list[str]:
    """``n`` jobs of a task no worker knows, run until they are dead letters."""
    jobs = await app.aenqueue_many([drumbeat.Prepared("no.such", [i], {}) for i in range(n)])
    # No grace for an unknown task: dead-lettered at its first claim, not handed back.
    app.settings = app.settings.replace(unknown_task_grace=0.0)
    async with running_worker(app):
        for job in jobs:
            with pytest.raises(drumbeat.JobFailed):
                await job.aresult(timeout=10)
    return [j.id for j in jobs]


async def test_retry_and_purge_all_in_batches(small_batches: drumbeat.App) -> None:
    app = small_batches
    ids = await _bury_unknown(app, 5)
    app.redis.zadd(app.keys.dead, {"orphan": 1})  # no job record: revive skips it
    assert admin.dead_count(app) == 6

    assert admin.retry_dead(app, None).jobs == 5
    assert [d.id for d in admin.dead_letters(app)] == ["orphan"]
    stats = admin.queue_stats(app)
    assert stats.ready == 5
    assert all(app.job(i).status() is drumbeat.JobStatus.QUEUED for i in ids)

    assert admin.retry_dead(app, ["orphan"]).jobs == 0
    assert admin.purge_dead(app, None) == 1
    assert admin.dead_count(app) == 0
    assert admin.retry_dead(app, None).jobs == 0
    assert admin.purge_dead(app, None) == 0


async def test_retry_and_purge_by_id(small_batches: drumbeat.App) -> None:
    app = small_batches
    ids = await _bury_unknown(app, 5)
    unknown = uuid.uuid4().hex
    assert admin.retry_dead(app, [ids[0], ids[0], unknown, ids[1], ids[2]]).jobs == 3
    assert admin.dead_count(app) == 2
    assert admin.purge_dead(app, [ids[0], ids[3], ids[3], ids[4]]) == 2  # ids[0] is queued now
    assert admin.dead_count(app) == 0
    assert not app.redis.hexists(app.keys.jobs, ids[3])
    assert app.job(ids[0]).status() is drumbeat.JobStatus.QUEUED
    assert admin.retry_dead(app, []).jobs == 0


async def test_retry_all_stops_at_what_was_dead_when_it_began(
    small_batches: drumbeat.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = small_batches
    await _bury_unknown(app, 4)
    original = app.scripts.revive
    late = uuid.uuid4().hex

    def revive_while_another_dies(
        ids: Sequence[str], queues: Sequence[str] = ()
    ) -> Call[list[int]]:
        # a job dying meanwhile (e.g. a retried one failing at once) lands after the snapshot
        client = app.redis
        if not client.zscore(app.keys.dead, late):
            client.zadd(app.keys.dead, {late: _now_ms(client) + 60_000})
            client.hset(app.keys.jobs, late, encode_spec(CODECS["json"], "x", b"[[],{}]"))
        return original(ids, queues)

    monkeypatch.setattr(app.scripts, "revive", revive_while_another_dies)
    assert admin.retry_dead(app, None).jobs == 4
    assert [d.id for d in admin.dead_letters(app)] == [late]


def test_stats_count_every_shard_the_workers_claim_from(redis_url: str, namespace: str) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, schedule_shards=4)

    @app.task(priority=7)
    def tick() -> None: ...

    app.schedule_many([drumbeat.Schedule(f"m{i}", tick, every=60) for i in range(8)])
    # Runs queued as jobs in two schedule shards (as a worker whose task has limits queues
    # them), one with its own priority.
    for sid, priority in (("m0", 7), ("m1", 7)):
        shard = app.scheduler.shards[app.scheduler.shard_of(sid)]
        app.redis.zadd(shard.ready, {f"s:{sid}": ready_score(priority, 1)})
    app.enqueue("t.job")  # a job in the jobs' shard, default priority 0
    app.enqueue_many([drumbeat.Prepared("t.later", [], {}, drumbeat.Options(delay=60))])
    shard = app.scheduler.shards[app.scheduler.shard_of("m5")]
    now = _now_ms(app.redis)
    app.redis.zadd(shard.leases, {"s:m5": now + 3000})
    app.redis.hset(shard.owners, "s:m5", f"1|w-9|{now}")

    stats = admin.queue_stats(app)
    assert stats.ready_by_priority[7] == 2 and stats.ready_by_priority[0] == 1
    assert stats.delayed == 1, "waiting schedules are not delayed jobs"
    assert stats.running_total == 1
    assert [(j.id, j.worker) for j in stats.running] == [("s:m5", "w-9")]
    app.close()
