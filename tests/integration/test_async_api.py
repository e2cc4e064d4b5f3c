"""The async twins of the App API on a real Redis, and bulk results in input order."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import drumbeat
from tests.conftest import running_worker


class _NoThreads(ThreadPoolExecutor):
    """A default executor that refuses work: an async method must not hide sync I/O in a thread.
    The one exception is redis-py's own: from 8.2 it packs a pipeline of 1,000 commands or more
    in a thread (CPU work, no I/O), and listing schedules scans every schedule."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if _packs_a_pipeline(fn):
            return super().submit(fn, *args, **kwargs)
        raise AssertionError(f"{fn!r} was sent to a thread; expected it to run on the event loop")


def _packs_a_pipeline(fn: Callable[..., Any]) -> bool:
    # asyncio.to_thread hands over functools.partial(context.run, <function>, ...)
    target = fn.args[0] if isinstance(fn, functools.partial) and fn.args else fn
    module = getattr(target, "__module__", None) or ""
    return getattr(target, "__name__", "") == "pack_commands" and module.startswith("redis.")


async def test_aenqueue_by_name_runs_the_task(app: drumbeat.App) -> None:
    @app.task(name="jobs.add")
    async def add(a: int, b: int = 0) -> int:
        return a + b

    async with running_worker(app):
        job = await app.aenqueue("jobs.add", 2, b=3)
        assert await job.aresult(timeout=10) == 5
    assert app.enqueue("jobs.add", 1).id != job.id


async def test_aenqueue_refuses_a_name_that_breaks_the_key_schema(app: drumbeat.App) -> None:
    with pytest.raises(drumbeat.InvalidJob, match="task name"):
        await app.aenqueue("bad name{x}")


async def test_aget_schedule_and_aschedules_read_with_the_async_client(
    redis_url: str, namespace: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, schedule_shards=3)

    @app.task
    async def ping(n: int) -> None: ...

    await app.aschedule_many(
        [drumbeat.Schedule(f"m:{i}", ping, every=30, args=(i,)) for i in range(9)]
    )
    await app.aschedule("other", ping, cron="0 9 * * *", args=(99,))
    await app.apause("m:4")
    asyncio.get_running_loop().set_default_executor(_NoThreads(max_workers=1))
    try:
        info = await app.aget_schedule("m:4")
        missing = await app.aget_schedule("nope")
        listed = await app.aschedules(prefix="m:")
        everything = await app.aschedules()
    finally:
        await app.aclose()
    assert info is not None and missing is None
    assert (info.id, info.task, info.args, info.paused) == ("m:4", ping.name, [4], True)
    assert info.cadence == drumbeat.Cadence(every=30)
    assert sorted(s.id for s in listed) == [f"m:{i}" for i in range(9)]
    assert {s.id for s in everything} == {f"m:{i}" for i in range(9)} | {"other"}
    # The async reads give what the sync ones give.
    assert {s.id: s for s in everything} == {s.id: s for s in app.schedules()}
    assert app.get_schedule("m:4") == info
    app.close()


def _mixed_upsert(app: drumbeat.App) -> tuple[list[drumbeat.Schedule], list[int]]:
    """Schedules spread over every shard whose codes (1 new, 2 changed, 0 unchanged) interleave,
    and the codes expected in input order. Writes the existing ones first."""

    @app.task(name="tick")
    def tick(n: int) -> None: ...

    old = [drumbeat.Schedule(f"old:{i}", tick, every=60, args=(i,)) for i in range(16)]
    assert sorted(app.schedule_many(old)) == [1] * 16
    items, expected = [], []
    for i in range(16):
        items.append(drumbeat.Schedule(f"new:{i}", tick, every=60, args=(i,)))
        expected.append(1)
        if i % 2:
            items.append(old[i])
            expected.append(0)
        else:
            items.append(drumbeat.Schedule(f"old:{i}", tick, every=60, args=(i + 100,)))
            expected.append(2)
    shards = [app.scheduler.shard_of(s.id) for s in items]
    assert len(set(shards)) == app.settings.schedule_shards, "the ids must cover every shard"
    by_shard = [
        c for s in dict.fromkeys(shards) for c, t in zip(expected, shards, strict=True) if t == s
    ]
    assert by_shard != expected, "shard order must differ from input order for the test to bite"
    return items, expected


def test_schedule_many_codes_come_in_input_order_across_shards(
    redis_url: str, namespace: str
) -> None:
    # batch_limit 3 also splits each shard's items over several script calls.
    app = drumbeat.App(redis_url, namespace=namespace, schedule_shards=4, batch_limit=3)
    try:
        items, expected = _mixed_upsert(app)
        assert app.schedule_many(items) == expected
        assert app.schedule_many(items) == [0] * len(items)
    finally:
        app.close()


async def test_aschedule_many_codes_come_in_input_order_across_shards(
    redis_url: str, namespace: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, schedule_shards=5, batch_limit=3)
    try:
        items, expected = _mixed_upsert(app)
        assert await app.aschedule_many(items) == expected
    finally:
        await app.aclose()
