"""With ``schedule_store="slots"``, the wheel keeps what the time slots cannot keep yet: limited
schedules and schedules routed to another queue. They run, are read, listed, counted, paused,
resumed, run now and removed through the same API; a schedule whose kind changes moves between
the two stores (answered 2, updated), and so does one the wheel kept from before the setting."""

from __future__ import annotations

import asyncio

import pytest
import redis

import drumbeat
from drumbeat.keys import bucket_of
from tests.conftest import running_worker
from tests.helpers import wait_for_async


def _in_wheel(r: redis.Redis, app: drumbeat.App, schedule_id: str) -> bool:
    keys = app.scheduler.shards[app.scheduler.homes(schedule_id)[-1]]
    return bool(r.hexists(keys.schedules(bucket_of(schedule_id)), schedule_id))


def _in_slots(r: redis.Redis, app: drumbeat.App, schedule_id: str) -> bool:
    keys = app.scheduler.shards[app.scheduler.shard_of(schedule_id)]
    return bool(r.hexists(keys.where, schedule_id))


async def test_limited_and_routed_schedules_run_from_the_wheel_beside_the_time_slots(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, schedule_store="slots")
    runs: list[str] = []

    @app.task(name="tick")
    async def tick(name: str) -> None:
        runs.append(name)

    @app.task(name="build", queue="builds")
    async def build(name: str) -> None:
        runs.append(name)

    codes = await app.aschedule_many([
        drumbeat.Schedule("plain", "tick", every=1, args=("plain",)),
        drumbeat.Schedule("limited", "tick", every=1, args=("limited",), concurrency_limit=1),
        drumbeat.Schedule("routed", "build", every=1, args=("routed",)),
    ])  # fmt: skip
    assert codes == [1, 1, 1]
    assert _in_slots(r, app, "plain") and not _in_wheel(r, app, "plain")
    for sid in ("limited", "routed"):
        assert _in_wheel(r, app, sid) and not _in_slots(r, app, sid), sid
    assert sorted(i.id for i in await app.aschedules()) == ["limited", "plain", "routed"]
    assert app.scheduler.count(app.redis) == 3
    routed = await app.aget_schedule("routed")
    assert routed is not None and routed.queue == "builds"

    async with running_worker(app, queues=["default", "builds"]):
        await wait_for_async(
            lambda: sorted(set(runs)),
            lambda seen: seen == ["limited", "plain", "routed"],
            message="every kind runs",
        )
        assert await app.apause("plain", "limited", "routed") == 3
        assert all(i.paused for i in await app.aschedules())
        assert await app.aresume("plain", "limited", "routed") == 3
        assert not any(i.paused for i in await app.aschedules())
        await asyncio.sleep(0.1)
    assert await app.aunschedule("plain", "limited", "routed", "ghost") == 3
    assert await app.aschedules() == []
    await app.aclose()


def test_a_schedule_whose_kind_changes_moves_between_the_stores(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    wheel = drumbeat.App(redis_url, namespace=namespace, schedule_store="wheel")
    wheel.task(name="tick")(lambda: None)
    wheel.schedule("old", "tick", every=60)  # kept by the wheel before the setting changed
    wheel.close()

    app = drumbeat.App(redis_url, namespace=namespace, schedule_store="slots")
    app.task(name="tick")(lambda: None)
    assert app.get_schedule("old") is not None, "read from the wheel"
    # Registered again under the time slots: moved there.
    assert app.schedule_many([drumbeat.Schedule("old", "tick", every=60)]) == [2]
    assert _in_slots(r, app, "old") and not _in_wheel(r, app, "old")

    assert app.schedule_many([drumbeat.Schedule("k", "tick", every=60)]) == [1]
    assert app.schedule_many([drumbeat.Schedule("k", "tick", every=60, rate_limit="1/s")]) == [2]
    assert _in_wheel(r, app, "k") and not _in_slots(r, app, "k")
    assert app.schedule_many([drumbeat.Schedule("k", "tick", every=60, rate_limit="1/s")]) == [0]
    assert app.schedule_many([drumbeat.Schedule("k", "tick", every=30)]) == [2]
    assert _in_slots(r, app, "k") and not _in_wheel(r, app, "k")
    info = app.get_schedule("k")
    assert info is not None and info.cadence.every == 30
    assert sorted(i.id for i in app.schedules()) == ["k", "old"]
    app.close()


async def test_a_time_slot_schedule_whose_task_gained_a_limit_moves_to_the_wheel_and_goes_on(
    redis_url: str, namespace: str, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Registered while its task had no limit, its worker's task has one: a time-slot run holds
    no lease, so it cannot wait for a permit. The worker moves the schedule to the wheel
    (skipping that run; the wheel's record starts its totals afresh) and its runs go on there
    under the limit, never two at once; it waited in its slot's lot for ever before."""
    before = drumbeat.App(redis_url, namespace=namespace, schedule_store="slots", min_interval=0.05)

    @before.task(name="poll")
    async def poll_unlimited(n: int) -> None: ...

    await before.aschedule("p", poll_unlimited, every=0.1, args=[1])
    await before.aclose()
    assert _in_slots(r, before, "p")

    after = drumbeat.App(redis_url, namespace=namespace, schedule_store="slots", idle_block=0.5,
                         min_interval=0.05)  # fmt: skip
    running, most, ran = 0, 0, 0

    @after.task(name="poll", concurrency_limit=1)
    async def poll(n: int) -> None:
        nonlocal running, most, ran
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.15)  # longer than its period: only the limit keeps them apart
        running -= 1
        ran += 1

    with caplog.at_level("WARNING", logger="drumbeat.worker"):
        async with running_worker(after, concurrency=4):
            await wait_for_async(lambda: ran >= 3, message="the runs should go on", timeout=20)
    assert _in_wheel(r, after, "p") and not _in_slots(r, after, "p")
    assert most == 1, f"{most} runs at once under a concurrency limit of 1"
    moved = [m for m in caplog.messages if "moved from the time slots to the wheel" in m]
    assert len(moved) == 1, moved
    await after.aunschedule("p")
    await after.aclose()


async def test_schedules_an_upgraded_app_kept_in_the_wheel_run_on_beside_the_time_slots(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    """Before the time slots were the default, every schedule went to the wheel: after the
    upgrade the workers still run them from there, until registered again or migrated."""
    before = drumbeat.App(redis_url, namespace=namespace, schedule_store="wheel")

    @before.task(name="tick")
    async def tick_before(name: str) -> None: ...

    await before.aschedule("old", tick_before, every=1, args=("old",))
    await before.aclose()
    after = drumbeat.App(redis_url, namespace=namespace)  # the default store: the time slots
    assert after.settings.schedule_store == "slots"
    runs: list[str] = []

    @after.task(name="tick")
    async def tick(name: str) -> None:
        runs.append(name)

    await after.aschedule("new", tick, every=1, args=("new",))
    assert _in_wheel(r, after, "old") and _in_slots(r, after, "new")
    async with running_worker(after):
        await wait_for_async(lambda: sorted(set(runs)), lambda seen: seen == ["new", "old"],
                             message="both stores' schedules run")  # fmt: skip
    await after.aunschedule("old", "new")
    await after.aclose()
