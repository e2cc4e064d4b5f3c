"""`batch_limit` and `concurrency` are bounded by what the Lua scripts can unpack (Lua's
unpack() returns at most 7,999 values): the bound itself works end to end, one past it is
refused with a clear error, and the scripts really fail one past it (so the bound is tight)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest
import redis

import drumbeat
from drumbeat.config import MAX_BATCH_LIMIT, MAX_CONCURRENCY, Settings
from drumbeat.errors import ConfigurationError
from tests.conftest import running_worker
from tests.helpers import leased


def test_settings_and_worker_refuse_past_the_bounds(redis_url: str) -> None:
    Settings(batch_limit=MAX_BATCH_LIMIT, concurrency=MAX_CONCURRENCY)
    with pytest.raises(ConfigurationError, match=f"batch_limit must be between 1 and "
                       f"{MAX_BATCH_LIMIT} .*got {MAX_BATCH_LIMIT + 1}"):  # fmt: skip
        Settings(batch_limit=MAX_BATCH_LIMIT + 1)
    with pytest.raises(ConfigurationError, match=f"concurrency must be between 1 and "
                       f"{MAX_CONCURRENCY} .*got {MAX_CONCURRENCY + 1}"):  # fmt: skip
        Settings(concurrency=MAX_CONCURRENCY + 1)
    app = drumbeat.App(redis_url, namespace="bounds")
    with pytest.raises(ConfigurationError, match=f"between 1 and {MAX_CONCURRENCY}"):
        drumbeat.Worker(app, concurrency=MAX_CONCURRENCY + 1)
    with pytest.raises(ConfigurationError, match="got -1"):
        drumbeat.Worker(app, concurrency=-1)


def _due_markers(r: redis.Redis, app: drumbeat.App, n: int) -> None:
    """``n`` limiter keys' markers due now (alone: the claim only reports them)."""
    r.zadd(app.keys.due, {f"l:t:k{i}": 0 for i in range(n)})


def test_a_claim_at_batch_limit_works_and_one_more_would_not(
    app: drumbeat.App, r: redis.Redis
) -> None:
    # The claim steps every due limiter marker it reports aside: 2 values per marker in one
    # ZADD. A busy worker's claim (limit 0) reports every one it reads.
    _due_markers(r, app, MAX_BATCH_LIMIT)
    result = app.scripts.claim("w", 0, 60_000, MAX_BATCH_LIMIT).run(r)
    assert len(result.limiters) == MAX_BATCH_LIMIT
    _due_markers(r, app, MAX_BATCH_LIMIT + 1)
    with pytest.raises(redis.ResponseError, match="too many results to unpack"):
        app.scripts.claim("w", 0, 60_000, MAX_BATCH_LIMIT + 1).run(r)
    r.delete(app.keys.due)

    # batch_limit due jobs, claimed and acked in one call each.
    @app.task
    async def noop() -> None:
        pass

    app.enqueue_many([noop.options(delay=0.05).prepare() for _ in range(MAX_BATCH_LIMIT)])
    deadline = time.monotonic() + 10
    while r.zcount(app.keys.due, 0, _redis_ms(r)) < MAX_BATCH_LIMIT:
        assert time.monotonic() < deadline, "the delayed jobs never came due"
        time.sleep(0.01)
    claimed = app.scripts.claim("w", MAX_BATCH_LIMIT, 60_000, MAX_BATCH_LIMIT).run(r).jobs
    assert len(claimed) == MAX_BATCH_LIMIT
    acks = app.scripts.complete([(j.id, j.token, b"x", 60_000, j.extra) for j in claimed])
    assert acks.run(r) == [1] * MAX_BATCH_LIMIT


def _redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def test_a_claim_past_max_concurrency_would_fail(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task
    async def noop() -> None:
        pass

    app.enqueue_many([noop.prepare() for _ in range(MAX_CONCURRENCY + 1)])
    with pytest.raises(redis.ResponseError, match="too many results to unpack"):
        app.scripts.claim("w", MAX_CONCURRENCY + 1, 60_000, 1).run(r)


async def test_a_worker_at_max_concurrency_renews_and_hands_back_every_claim(
    redis_url: str, namespace: str, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="drumbeat")
    app = drumbeat.App(redis_url, namespace=namespace, lease=1.5, shutdown_grace=0.5)
    release = asyncio.Event()
    started = 0

    @app.task
    async def hold() -> None:
        nonlocal started
        started += 1
        await release.wait()

    await app.aenqueue_many([hold.prepare() for _ in range(MAX_CONCURRENCY)])
    job_id = r.zrange(app.keys.ready, 0, 0)[0]
    async with running_worker(app, concurrency=MAX_CONCURRENCY) as worker:
        await _until(lambda: started == MAX_CONCURRENCY, "every job to start")
        assert len(worker.table) == MAX_CONCURRENCY
        first = r.zscore(app.keys.leases, job_id)
        assert first is not None
        await _until(lambda: (r.zscore(app.keys.leases, job_id) or 0) > first,
                     "the heartbeat to renew the leases")  # fmt: skip
    assert r.zcard(app.keys.ready) == MAX_CONCURRENCY, "not every claim was handed back"
    assert leased(r, app.keys.leases) == 0
    assert f"handed {MAX_CONCURRENCY} unfinished jobs back" in caplog.text
    assert "lease renewal failed" not in caplog.text, caplog.text
    await app.aclose()


async def _until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, f"after {timeout} s still waiting for: {what}"
        await asyncio.sleep(0.02)
