"""`Link`: the worker's hot-path connection (calls sent in one write, replies read in order)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aredis

import drumbeat
from drumbeat.replies import ClaimResult
from drumbeat.scripts import Call
from drumbeat.worker.link import Link


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aredis.Redis]:
    c = aredis.Redis.from_url(redis_url, socket_timeout=0.5)
    yield c
    await c.aclose()


@pytest.fixture
async def link(client: aredis.Redis) -> AsyncIterator[Link]:
    one = Link(client)
    yield one
    await one.aclose()


@pytest.fixture
def work(app: drumbeat.App) -> drumbeat.Task[[int], None]:
    @app.task
    async def work(i: int) -> None: ...

    return work


def _claim(app: drumbeat.App, limit: int) -> Call[ClaimResult]:
    return app.scripts.claim("worker-x", limit, 10_000, 100)


def _broken_claim(app: drumbeat.App) -> Call[ClaimResult]:
    """A call the script refuses with an error (its limit is not a number)."""
    good = _claim(app, 1)
    return Call("claim", good.keys, ["worker-x", "not a number", 10_000, 100], good.parse)


async def test_calls_sent_together_get_their_own_replies_in_order(
    app: drumbeat.App, link: Link, work: drumbeat.Task[[int], None]
) -> None:
    jobs = [await work.aenqueue(i) for i in range(3)]
    claims = [_claim(app, 1) for _ in range(3)]
    results = await link.run([*claims, app.scripts.job_status(jobs[0].id)])
    assert [r.jobs[0].id for r in results[:3]] == [j.id for j in jobs]
    assert results[3].status == "running"


async def test_scripts_flushed_by_redis_are_run_again_in_order(
    app: drumbeat.App, client: aredis.Redis, link: Link, work: drumbeat.Task[[int], None]
) -> None:
    jobs = [await work.aenqueue(i) for i in range(2)]
    await client.script_flush()  # as after a restart or failover
    first, status, second = await link.run(
        [_claim(app, 1), app.scripts.job_status(jobs[1].id), _claim(app, 1)]
    )
    assert [first.jobs[0].id, second.jobs[0].id] == [j.id for j in jobs]
    assert status.status == "queued", "run between the claims, as sent"
    (third,) = await link.run([_claim(app, 1)])  # the scripts are loaded again: EVALSHA works
    assert third.jobs == []


async def test_an_error_reply_raises_and_the_next_reply_is_still_its_own(
    app: drumbeat.App, link: Link, work: drumbeat.Task[[int], None]
) -> None:
    job = await work.aenqueue(1)
    good, bad = _claim(app, 1), _broken_claim(app)
    await link.send([bad, good])
    with pytest.raises(redis.ResponseError):
        await link.next()
    call, result = await link.next()
    assert call is good and [j.id for j in result.jobs] == [job.id]
    assert link.unread == 0


async def test_a_lost_connection_raises_and_the_next_call_reconnects(
    app: drumbeat.App, link: Link, r: redis.Redis, work: drumbeat.Task[[int], None]
) -> None:
    await link.run([_claim(app, 1)])
    r.client_kill_filter(_type="normal", skipme=True)
    await link.send([_claim(app, 1)])
    with pytest.raises(redis.ConnectionError):
        await link.next()
    assert link.unread == 0, "replies that will never come are forgotten"
    job = await work.aenqueue(1)
    (result,) = await link.run([_claim(app, 1)])
    assert [j.id for j in result.jobs] == [job.id]


async def test_a_reply_that_does_not_come_times_out(
    app: drumbeat.App, link: Link, r: redis.Redis
) -> None:
    await link.run([_claim(app, 1)])
    r.client_pause(1500, all=True)
    try:
        with pytest.raises(redis.TimeoutError):
            await link.run([_claim(app, 1)])  # the client's socket timeout is 0.5 s
    finally:
        r.client_unpause()
    (result,) = await link.run([_claim(app, 1)])
    assert result.jobs == []


async def test_run_reads_every_reply_before_it_raises_an_error(
    app: drumbeat.App, link: Link, work: drumbeat.Task[[int], None]
) -> None:
    job = await work.aenqueue(1)
    good, bad = _claim(app, 1), _broken_claim(app)
    with pytest.raises(redis.ResponseError):
        await link.run([bad, good])
    assert link.unread == 0
    assert await job.astatus() is drumbeat.JobStatus.RUNNING, "the good claim ran"
    (again,) = await link.run([_claim(app, 1)])
    assert again.jobs == []


async def test_replies_left_unread_are_not_taken_for_the_next_calls(
    app: drumbeat.App, link: Link, work: drumbeat.Task[[int], None]
) -> None:
    job = await work.aenqueue(1)
    await link.send([_claim(app, 0), _claim(app, 0)])
    await link.next()  # the second reply is never read
    (status,) = await link.run([app.scripts.job_status(job.id)])
    assert status.status == "queued"
    assert link.unread == 0
