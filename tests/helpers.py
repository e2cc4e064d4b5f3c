"""Waiting in tests without guessing durations.

A test that sleeps a fixed time and then asserts either wastes that time on a fast machine or
flakes on a slow one. These helpers poll a condition up to a generous deadline instead, and on
timeout fail with what was expected and the last value seen; `Probe` turns "X did not happen"
into a wait for a later event that proves the worker went past the point where X would have.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis

import drumbeat
from drumbeat.protocol import KEEP_FIELD, LEASES_HELD

T = TypeVar("T")

# Far above what any wait takes on an idle machine, well under pytest's 120 s per test.
DEFAULT_TIMEOUT = 20.0


def _timed_out(message: str, timeout: float, last: object) -> AssertionError:
    return AssertionError(f"{message} (not reached within {timeout} s; last seen: {last!r})")


def wait_for(
    observe: Callable[[], T],
    until: Callable[[T], object] = bool,
    *,
    message: str,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.02,
) -> T:
    """Calls ``observe()`` until ``until(value)`` holds; returns that value.

    Raises:
        AssertionError: ``message`` and the last observed value, once ``timeout`` passed.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = observe()
        if until(value):
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(message, timeout, value)
        time.sleep(interval)


async def wait_for_async(
    observe: Callable[[], T | Awaitable[T]],
    until: Callable[[T], object] = bool,
    *,
    message: str,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.02,
) -> T:
    """`wait_for` for a test on an event loop: yields to the loop (and so to a worker running
    on it) between looks; ``observe`` may be a plain or a coroutine function."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = observe()
        if inspect.isawaitable(value):
            value = await value
        if until(value):  # type: ignore[arg-type]
            return value  # type: ignore[return-value]
        if loop.time() >= deadline:
            raise _timed_out(message, timeout, value)
        await asyncio.sleep(interval)


async def wait_for_event(event: asyncio.Event, *, message: str, timeout: float = 10.0) -> None:
    """``event.wait()`` with a deadline and a message instead of the 120 s test timeout."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        raise AssertionError(f"{message} (not within {timeout} s)") from None


def entries(r: redis.Redis, key: str) -> int:
    """The fields of a `state`, `owners` or `jobs` hash, not counting the one kept so that
    Redis stores it as a hash table (`protocol.KEEP_FIELD`)."""
    return int(r.hlen(key)) - int(r.hexists(key, KEEP_FIELD))


def leased(r: redis.Redis, key: str) -> int:
    """The leases a `leases` key holds, not counting the member kept so that Redis stores it
    as a skiplist (`protocol.LEASES_KEEP`)."""
    return int(r.zcount(key, *LEASES_HELD))


def redis_now_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def commands(r: redis.Redis, name: str) -> int:
    """Calls of one command since the server started: server-wide, so only meaningful on a
    server of the test's own (the `own_redis` fixture)."""
    stats: dict[str, Any] = r.info("commandstats")
    return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))


def blocked_in(r: redis.Redis, command: str) -> list[dict[str, Any]]:
    """The clients blocked in ``command`` now, as `CLIENT LIST` shows them (``idle``: seconds
    since the client last sent anything, counted in whole seconds of the server's clock)."""
    return [
        c for c in r.client_list() if c.get("cmd") == command and "b" in str(c.get("flags", ""))
    ]


class Probe:
    """A no-op task whose completion proves that a worker's claims reached a Redis time.

    Register it before the worker starts (``probe = Probe(app)``); then ``await
    probe.passed(r, at_ms)`` returns once the worker has claimed at or after ``at_ms`` and
    started everything that claim made runnable (due jobs, due schedule runs).
    """

    def __init__(self, app: drumbeat.App) -> None:
        @app.task(name="tests.probe")
        async def probe() -> None: ...

        self.task = probe

    async def passed(self, r: redis.Redis, at_ms: int, *, timeout: float = 10.0) -> None:
        delay = max(0, at_ms - redis_now_ms(r)) / 1000
        # A job due at `at_ms` is taken only by a claim made at or after it, and that claim
        # also promotes every job and schedule run due by then.
        first = await self.task.options(delay=delay).aenqueue()
        # The worker may still be starting the schedule runs that claim reported when the
        # first probe ends; a job enqueued now is taken by a later claim, after all of them.
        await self._done(first, delay + timeout, at_ms)
        await self._done(await self.task.aenqueue(), timeout, at_ms)

    @staticmethod
    async def _done(job: drumbeat.Job, timeout: float, at_ms: int) -> None:
        try:
            await job.aresult(timeout=timeout)
        except drumbeat.ResultTimeout:
            raise AssertionError(
                f"the worker did not claim past Redis time {at_ms} ms: probe job {job.id} "
                f"not done within {timeout:.1f} s"
            ) from None


class Gate:
    """A task that blocks its first run until released, counting every run."""

    def __init__(self, app: drumbeat.App) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.runs = 0

        @app.task(name="gated")
        async def gated() -> None:
            self.runs += 1
            if self.runs == 1:
                self.started.set()
                await self.release.wait()

        self.task = gated


def set_due(r: redis.Redis, app: drumbeat.App, schedule_id: str, due_ms: int) -> None:
    """Moves a waiting schedule's entry, its grid slot with it, into the slot of ``due_ms``."""
    shard = app.scheduler.home_of(r, schedule_id)
    assert shard is not None, f"no schedule {schedule_id!r}"
    keys = app.scheduler.shards[shard]
    at = int(r.hget(keys.where, schedule_id) or 0)
    head = f"{schedule_id}|".encode()
    entry = next(e for e in r.lrange(keys.slot(at), 0, -1) if e.startswith(head))
    gen, _, rest = entry[len(head) :].split(b"|", 2)
    r.lrem(keys.slot(at), 1, entry)
    if not r.exists(keys.slot(at)):
        r.zrem(keys.slots, at)
    r.rpush(keys.slot(due_ms), head + b"|".join((gen, str(due_ms).encode(), rest)))
    r.zadd(keys.slots, {str(due_ms): due_ms})
    r.hset(keys.where, schedule_id, due_ms)


async def claim_due_runs(
    app: drumbeat.App, r: redis.Redis, n: int, worker: str = "w1"
) -> tuple[Any, list[Any]]:
    """Claims ``n`` due time-slot runs of the app's first schedule shard as worker ``worker``'s
    lane does (its first claim learns which slots are due): (the `SlotLane`, the runs by id)."""
    from drumbeat.worker.slotted import SlotLane

    lane = SlotLane(worker, [app.scheduler.shards[0]], app.settings, [0])
    client = await app.aredis()
    runs: list[Any] = []
    for _ in range(5):
        replies = [call.run(r) for call in lane.calls(0, 10, redis_now_ms(r))]
        runs += (await lane.took(0, replies, client))[1]
        if len(runs) >= n:
            break
    return lane, sorted(runs, key=lambda run: run.id)
