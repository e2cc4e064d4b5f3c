"""`Waiter`: an idle worker's BZPOPMIN with its claim pipelined behind it, on real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aredis

import drumbeat
from drumbeat.replies import ClaimResult
from drumbeat.scripts import Call
from drumbeat.worker.waiter import PopRefused, Waiter
from tests.conftest import RedisServer
from tests.helpers import blocked_in, wait_for_async


@pytest.fixture
def redis_url(own_redis: RedisServer) -> str:
    """A server of this test's own: the only client blocked there is the waiter under test."""
    return own_redis.url


async def _blocked(r: redis.Redis) -> None:
    await wait_for_async(lambda: blocked_in(r, "bzpopmin"), message="the waiter should block")


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aredis.Redis]:
    c = aredis.Redis.from_url(redis_url, socket_timeout=30)
    yield c
    await c.aclose()


@pytest.fixture
async def waiter(app: drumbeat.App, client: aredis.Redis) -> AsyncIterator[Waiter]:
    w = Waiter(client, [app.keys.wake], idle_block=20)  # a pop far longer than any test waits
    yield w
    await w.aclose()


@pytest.fixture
def work(app: drumbeat.App) -> drumbeat.Task[[], None]:
    @app.task
    async def work() -> None: ...

    return work


@pytest.fixture
def claim(app: drumbeat.App) -> Call[ClaimResult]:
    return app.scripts.claim("worker-x", 5, 10_000, 100)


async def test_the_claim_runs_as_soon_as_a_job_is_enqueued(
    client: aredis.Redis,
    waiter: Waiter,
    work: drumbeat.Task[[], None],
    claim: Call[ClaimResult],
    r: redis.Redis,
) -> None:
    await claim.arun(client)  # loads the script (the wait's EVALSHA does not)
    waiting = asyncio.ensure_future(waiter.block_then(claim))
    await _blocked(r)
    assert not waiting.done()
    job = await work.aenqueue()
    raw = await asyncio.wait_for(waiting, 10)  # long before the pop's 20 s
    assert [j.id for j in claim.parse(raw).jobs] == [job.id]


async def test_unblocking_still_reads_the_claim_and_keeps_the_connection_in_step(
    client: aredis.Redis,
    waiter: Waiter,
    work: drumbeat.Task[[], None],
    claim: Call[ClaimResult],
    r: redis.Redis,
) -> None:
    await claim.arun(client)
    waiting = asyncio.ensure_future(waiter.block_then(claim))
    await _blocked(r)
    await asyncio.wait_for(waiter.unblock(), 10)
    assert claim.parse(await asyncio.wait_for(waiting, 10)).jobs == []
    again = asyncio.ensure_future(waiter.block_then(claim))
    job = await work.aenqueue()
    raw = await asyncio.wait_for(again, 10)
    assert [j.id for j in claim.parse(raw).jobs] == [job.id]


async def test_a_flushed_script_is_reported_not_lost(
    client: aredis.Redis,
    waiter: Waiter,
    work: drumbeat.Task[[], None],
    claim: Call[ClaimResult],
    r: redis.Redis,
) -> None:
    await client.script_flush()
    waiting = asyncio.ensure_future(waiter.block_then(claim))
    await _blocked(r)
    job = await work.aenqueue()
    assert await asyncio.wait_for(waiting, 10) is None, "NOSCRIPT: the caller claims again"
    assert [j.id for j in (await claim.arun(client)).jobs] == [job.id]


async def test_a_refused_pop_still_gives_what_the_claim_behind_it_took(
    client: aredis.Redis,
    waiter: Waiter,
    work: drumbeat.Task[[], None],
    claim: Call[ClaimResult],
    r: redis.Redis,
) -> None:
    """Redis answers the pop with an error (here WRONGTYPE; on a cluster, ASK while the slot
    migrates) and runs the claim behind it all the same: what it took comes back with the
    error, where before the connection was dropped with its reply unread, and those jobs
    waited for their leases to expire."""
    await claim.arun(client)
    job = await work.aenqueue()
    wake = waiter._pop[1]
    r.delete(wake)
    r.set(wake, "not a sorted set")
    with pytest.raises(PopRefused) as refused:
        await asyncio.wait_for(waiter.block_then(claim), 10)
    assert "WRONGTYPE" in str(refused.value.refused)
    assert refused.value.claim is not None, "the claim's reply was read"
    assert [j.id for j in claim.parse(refused.value.claim).jobs] == [job.id]
