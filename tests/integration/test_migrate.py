"""``drumbeat schedules migrate --to slots``: a namespace's schedules move from the wheel into
the time slots with their totals, generations, due times, pauses and last errors, and run on
from there; limited ones stay in the wheel, and a bucket whose schedule has a run queued stops
the migration there."""

from __future__ import annotations

import asyncio

import pytest
import redis

import drumbeat
from drumbeat.admin import migrate
from drumbeat.keys import bucket_of
from drumbeat.schedules import ScheduleInfo
from tests.conftest import running_worker
from tests.helpers import wait_for_async
from tests.integration.test_cli import APP, cli_env, ok, run

__all__ = ["cli_env"]  # a fixture, imported for its tests


def _kept(info: ScheduleInfo | None) -> tuple[object, ...]:
    """What a move must keep of a schedule."""
    assert info is not None
    return (info.runs, info.failures, info.generation, info.paused, info.next_due_ms,
            info.last_error, info.args, info.cadence)  # fmt: skip


def _wheel_keys(r: redis.Redis, namespace: str) -> list[bytes]:
    return [k for k in r.scan_iter(f"*{namespace}*") if b":wheel:" in k or b":schedules:" in k]


async def test_schedules_move_into_the_time_slots_and_run_on(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    wheel = drumbeat.App(redis_url, namespace=namespace, schedule_store="wheel")
    runs: list[str] = []

    async def tick(name: str) -> None:
        runs.append(name)

    async def fail() -> None:
        raise RuntimeError("upstream said no")

    for app in (wheel,):
        app.task(name="tick")(tick)
        app.task(name="fail", retries=0)(fail)
    await wheel.aschedule("often", "tick", every=1, args=("often",))
    await wheel.aschedule("hourly", "tick", every=3600, args=("hourly",))
    await wheel.aschedule("broken", "fail", every=1)
    await wheel.aschedule("daily", "tick", cron="0 9 * * *", tz="Asia/Tokyo", args=("daily",))
    await wheel.aschedule("limited", "tick", every=60, args=("x",), concurrency_limit=1)
    async with running_worker(wheel):
        await wait_for_async(
            lambda: wheel.aget_schedule("broken"),
            lambda i: i is not None and i.failures >= 1 and runs.count("often") >= 2,
            message="runs on the wheel first",
        )
    assert await wheel.apause("hourly") == 1
    ids = ["often", "hourly", "broken", "daily"]
    before = {i: _kept(await wheel.aget_schedule(i)) for i in ids}

    limited = _kept(await wheel.aget_schedule("limited"))
    moved = migrate.to_slots(wheel)
    # The limited schedule stays in the wheel, which keeps it with the time slots too.
    assert (moved.waiting, moved.paused, moved.kept) == (3, 1, 1)
    bucket = bucket_of("limited")
    left = [k for k in _wheel_keys(r, namespace) if not k.endswith(b":%d" % bucket)]
    assert left == [], "only the limited schedule's bucket is left"
    markers = [m for m in r.zrange(wheel.keys.due, 0, -1) if m.startswith(b"w:")]
    assert markers == [b"w:%d" % bucket] or markers == []
    await wheel.aclose()

    slots = drumbeat.App(redis_url, namespace=namespace)
    slots.task(name="tick")(tick)
    slots.task(name="fail", retries=0)(fail)
    assert {i: _kept(await slots.aget_schedule(i)) for i in ids} == before
    assert _kept(await slots.aget_schedule("limited")) == limited
    assert sorted(i.id for i in await slots.aschedules()) == sorted([*ids, "limited"])
    ran = runs.count("often")
    async with running_worker(slots):
        await wait_for_async(
            lambda: slots.aget_schedule("often"),
            lambda i: i is not None and i.runs >= before["often"][0] + 2,
            message="runs on from the time slots",
        )
        await asyncio.sleep(0.1)
    assert runs.count("often") >= ran + 2 and "hourly" not in runs
    info = await slots.aget_schedule("often")
    assert info is not None and info.generation == before["often"][2]
    assert await slots.aresume("hourly") == 1
    await slots.aclose()


def test_a_schedule_with_a_run_queued_stops_the_migration_at_its_bucket(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, schedule_store="wheel")
    app.task(name="tick")(lambda: None)
    app.schedule("queued", "tick", every=60)
    app.schedule("waiting", "tick", every=60)
    assert app.run_now("queued") == 1  # queued in `ready`, no worker to take it
    with pytest.raises(migrate.MigrationRefused, match="'queued' has a run queued or in flight"):
        migrate.to_slots(app)
    info = app.get_schedule("queued")
    assert info is not None, "its bucket stays in the wheel"
    assert not r.hexists(app.keys.where, "queued")
    app.close()


def test_the_cli_migrates_and_says_what_to_run_next(
    cli_env: None, redis_url: str, namespace: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, schedule_store="wheel")
    app.task(name="add")(lambda a, b=0: a + b)
    app.schedule("ping.a", "add", every=5, args=[1, 2])
    app.schedule("ping.b", "add", every=60, args=[3])
    app.pause("ping.b")
    refused = run("schedules", "migrate", APP, "--to", "wheel", "--yes")
    assert refused.exit_code == 2 and "--to must be slots" in refused.output
    asked = run("schedules", "migrate", APP, "--to", "slots", input="n\n")
    assert asked.exit_code == 1 and app.get_schedule("ping.a") is not None
    out = ok("schedules", "migrate", APP, "--to", "slots", "--yes").stdout
    assert "moved 1 waiting and 1 paused schedules into the time slots" in out
    assert 'schedule_store="slots"' in out
    app.close()
    slots = drumbeat.App(redis_url, namespace=namespace)
    info = slots.get_schedule("ping.b")
    assert info is not None and info.paused and info.args == [3]
    slots.close()
