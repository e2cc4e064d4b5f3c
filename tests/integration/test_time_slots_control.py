"""Pause, resume and run now of schedules in the time slots: a paused schedule's entry waits
in `paused` and runs no more; a pause or a resume asked while its run is in flight is applied
when the run settles; a run now runs once and keeps the cadence (a paused schedule stays paused
after it); upserts and removals find a paused schedule where it waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis

import drumbeat
from drumbeat.keys import Keys
from drumbeat.schedule import phase_ms
from drumbeat.testing import arun_until_idle
from tests.conftest import running_worker
from tests.helpers import Gate, wait_for_async


def _app(redis_url: str, namespace: str) -> drumbeat.App:
    return drumbeat.App(redis_url, namespace=namespace)


def _now_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def _at(r: redis.Redis, keys: Keys, schedule_id: str) -> str | None:
    """What `where` says of the schedule: its slot's ms, "p" while paused."""
    got = r.hget(keys.where, schedule_id)
    return None if got is None else got.decode()


def _slotted(r: redis.Redis, keys: Keys) -> list[bytes]:
    """Every entry waiting in a slot."""
    return [e for ms in r.zrange(keys.slots, 0, -1) for e in r.lrange(keys.slot(int(ms)), 0, -1)]


async def test_pause_resume_and_run_now_of_a_waiting_schedule(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = _app(redis_url, namespace)
    keys = Keys(namespace)
    ran: list[int] = []

    @app.task
    async def tick() -> None:
        ran.append(drumbeat.current_job().due_ms or 0)

    await app.aschedule("t", tick, every=60)
    waiting = await app.aget_schedule("t")
    assert waiting is not None and waiting.next_due_ms is not None and not waiting.paused
    slot = waiting.next_due_ms

    # Paused: out of its slot, into `paused`; a second pause changes nothing.
    assert await app.apause("t") == 1
    assert await app.apause("t") == 0
    assert _at(r, keys, "t") == "p" and _slotted(r, keys) == []
    info = await app.aget_schedule("t")
    assert info is not None and info.paused and info.next_due_ms is None
    [listed] = await app.aschedules()
    assert listed.id == "t" and listed.paused

    # A run now of a paused schedule runs once, and the schedule is paused again after it.
    assert await app.arun_now("t") == 1
    assert await arun_until_idle(app) == 1
    info = await app.aget_schedule("t")
    assert info is not None and info.runs == 1 and info.paused, "settled, paused again"
    assert len(ran) == 1 and _at(r, keys, "t") == "p"

    # Resumed at its next grid slot from now (the paused stretch is not caught up).
    before = _now_ms(r)
    assert await app.aresume("t") == 1
    assert await app.aresume("t") == 0
    info = await app.aget_schedule("t")
    assert info is not None and not info.paused and info.next_due_ms is not None
    assert before < info.next_due_ms <= before + 60_000
    assert (info.next_due_ms - phase_ms("t", 60_000)) % 60_000 == 0, "not on its grid"
    assert _at(r, keys, "t") == str(info.next_due_ms) and not r.exists(keys.paused)
    slot = info.next_due_ms

    # A run now of a waiting schedule runs at once and keeps the slot it jumped ahead of.
    assert await app.arun_now("t") == 1
    assert await arun_until_idle(app) == 1
    info = await app.aget_schedule("t")
    assert info is not None and info.runs == 2, "the run-now run settles"
    assert len(ran) == 2
    assert info.next_due_ms == slot, "run now moved the schedule's slot"
    assert await app.arun_now("nope") == 0
    await app.aclose()


@asynccontextmanager
async def _in_flight(redis_url: str, namespace: str) -> AsyncIterator[tuple[drumbeat.App, Gate]]:
    """A worker running the first run of schedule "g" (every second), held until released."""
    app = _app(redis_url, namespace)
    gate = Gate(app)
    await app.aschedule("g", gate.task, every=1)
    try:
        async with running_worker(app):
            await asyncio.wait_for(gate.started.wait(), 30)
            yield app, gate
        info = await app.aget_schedule("g")
        assert info is not None and not info.paused
    finally:
        await app.aclose()


async def test_a_pause_asked_while_the_run_is_in_flight_applies_when_it_settles(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    keys = Keys(namespace)
    async with _in_flight(redis_url, namespace) as (app, gate):
        assert await app.apause("g") == 1
        assert await app.apause("g") == 0, "a pause waits already"
        # Read as paused at once, though its run goes on.
        info = await app.aget_schedule("g")
        assert info is not None and info.paused and info.next_due_ms is None
        assert [i.paused for i in await app.aschedules()] == [True]
        assert await app.arun_now("g") == 0, "its run is in flight"
        # Changed meanwhile too: the paused entry gets the new definition.
        assert await app.aschedule_many([drumbeat.Schedule("g", gate.task, every=2)]) == [2]
        gate.release.set()
        info = await wait_for_async(
            lambda: app.aget_schedule("g"),
            lambda i: i is not None and i.paused and i.runs >= 1,
            message="the run settles into `paused`",
        )
        assert info is not None and info.runs == 1 and info.generation == 2
        assert info.next_due_ms is None
        # Had the pause been lost, the next run would be due within 2 s of the settle.
        await asyncio.sleep(2.5)
        assert gate.runs == 1, "a paused schedule ran again"
        assert _at(r, keys, "g") == "p" and not r.exists(keys.pending)
        assert await app.aresume("g") == 1
        await wait_for_async(lambda: gate.runs, lambda n: n >= 2, message="resumed: runs again")


async def test_a_resume_while_the_run_is_in_flight_calls_its_pause_off(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    async with _in_flight(redis_url, namespace) as (app, gate):
        assert await app.apause("g") == 1
        assert await app.aresume("g") == 1
        assert not r.exists(Keys(namespace).pending)
        gate.release.set()
        await wait_for_async(lambda: gate.runs, lambda n: n >= 2, message="it runs on")


def test_a_paused_schedule_is_changed_and_removed_where_it_waits(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = _app(redis_url, namespace)
    keys = Keys(namespace)

    @app.task
    def t(n: int) -> None: ...

    app.schedule("p", t, every=5, args=(1,))
    assert app.pause("p") == 1
    assert app.schedule_many([drumbeat.Schedule("p", t, every=5, args=(1,))]) == [0]
    assert app.schedule_many([drumbeat.Schedule("p", t, every=7, args=(2,))]) == [2]
    info = app.get_schedule("p")
    assert info is not None and info.paused and info.generation == 2 and info.args == [2]
    assert _at(r, keys, "p") == "p" and _slotted(r, keys) == []
    # Resumed on the changed cadence.
    assert app.resume("p") == 1
    info = app.get_schedule("p")
    assert info is not None and info.next_due_ms is not None
    assert (info.next_due_ms - phase_ms("p", 7000)) % 7000 == 0
    assert app.pause("p") == 1
    assert app.unschedule("p") == 1
    assert app.get_schedule("p") is None
    assert not r.exists(keys.paused) and not r.exists(keys.where)
    assert app.pause("p") == app.resume("p") == app.run_now("p") == 0
    app.close()
