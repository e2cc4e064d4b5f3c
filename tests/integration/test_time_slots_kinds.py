"""Every kind of schedule lives in the time slots: a limited one, and one routed to another
queue, wait there as plain ones do, and each of their runs goes to its queue as a job for that
one attempt (queue_runs.lua), where it waits for its limits and the workers of its queue, and
is settled back into its next slot from there (finish_runs.lua). A change by id made while such
a run is queued is applied when it settles, as for a run in flight."""

from __future__ import annotations

import asyncio

import pytest
import redis

import drumbeat
from drumbeat.protocol import QUEUED_AT, RUN_PREFIX
from drumbeat.replies import Claimed, QueuedRuns
from drumbeat.schedules.slots import SlotScripts
from drumbeat.testing import arun_until_idle
from drumbeat.worker.slotted import queue_item
from tests.conftest import running_worker
from tests.helpers import claim_due_runs, wait_for_async


def _where(r: redis.Redis, app: drumbeat.App, schedule_id: str) -> bytes | None:
    """What `where` says of a schedule in the shard it lives in (None: in none)."""
    for shard in app.scheduler.homes(schedule_id):
        at = r.hget(app.scheduler.shards[shard].where, schedule_id)
        if at is not None:
            return at  # type: ignore[no-any-return]
    return None


async def test_limited_and_routed_schedules_wait_in_the_time_slots_and_run_as_jobs(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    default = drumbeat.App(redis_url, namespace=namespace)
    builder = drumbeat.App(redis_url, namespace=namespace)
    runs: list[str] = []

    @default.task(name="tick")
    async def tick(name: str) -> None:
        runs.append(name)

    @default.task(name="build", queue="builds")
    async def build_here(name: str) -> None:
        runs.append("build run by a worker that does not serve builds")

    @builder.task(name="build", queue="builds")
    async def build(name: str) -> None:
        runs.append(name)

    codes = await default.aschedule_many([
        drumbeat.Schedule("plain", "tick", every=1, args=("plain",)),
        drumbeat.Schedule("limited", "tick", every=1, args=("limited",), concurrency_limit=1),
        drumbeat.Schedule("routed", "build", every=1, args=("routed",)),
    ])  # fmt: skip
    assert codes == [1, 1, 1]
    assert all(_where(r, default, sid) is not None for sid in ("plain", "limited", "routed"))
    assert sorted(i.id for i in await default.aschedules()) == ["limited", "plain", "routed"]
    assert default.scheduler.count(default.redis) == 3
    routed = await default.aget_schedule("routed")
    assert routed is not None and routed.queue == "builds"

    async with (
        running_worker(default, queues=["default"]),
        running_worker(builder, queues=["builds"]),
    ):
        await wait_for_async(
            lambda: sorted(set(runs)),
            lambda seen: seen == ["limited", "plain", "routed"],
            message="every kind runs, the routed one on the worker of its queue",
        )
        assert await default.apause("plain", "limited", "routed") == 3
        await wait_for_async(
            default.aschedules, lambda infos: all(i.paused for i in infos),
            message="paused (a run queued or in flight pauses when it settles)",
        )  # fmt: skip
        assert await default.aresume("plain", "limited", "routed") == 3
        assert not any(i.paused for i in await default.aschedules())
    limited = await default.aget_schedule("limited")
    assert limited is not None and limited.runs >= 1 and limited.last_lateness_ms is not None
    assert await default.aunschedule("plain", "limited", "routed", "ghost") == 3
    assert await default.aschedules() == []
    await default.aclose()
    await builder.aclose()


async def test_a_task_with_a_limit_never_runs_two_of_its_schedules_runs_at_once(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    """Registered while its task had no limit, its worker's task has one (a record that says
    nothing of limits): the runs wait for their permit as jobs, never two at once, and the
    schedule stays where it is."""
    before = drumbeat.App(redis_url, namespace=namespace, min_interval=0.05)

    @before.task(name="poll")
    async def poll_unlimited(n: int) -> None: ...

    await before.aschedule("p", poll_unlimited, every=0.1, args=[1])
    await before.aclose()
    after = drumbeat.App(redis_url, namespace=namespace, min_interval=0.05)
    running, most, ran = 0, 0, 0

    @after.task(name="poll", concurrency_limit=1)
    async def poll(n: int) -> None:
        nonlocal running, most, ran
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.15)  # longer than its period: only the limit keeps them apart
        running -= 1
        ran += 1

    async with running_worker(after, concurrency=4):
        await wait_for_async(lambda: ran >= 4, message="the runs should go on", timeout=20)
    assert most == 1, f"{most} runs at once under a concurrency limit of 1"
    info = await after.aget_schedule("p")
    assert info is not None and info.runs >= 4 and info.failures == 0
    await after.aunschedule("p")
    await after.aclose()


async def _queued_run(r: redis.Redis, app: drumbeat.App, schedule_id: str) -> None:
    """Runs a worker of the default queue (whose workers keep every schedule) until it is
    idle: the schedule's run waits queued in its queue (nobody serves that queue), not run."""
    assert await arun_until_idle(app, queues=["default"]) == 0
    at = _where(r, app, schedule_id)
    assert at == QUEUED_AT.encode(), f"its run should be queued as a job, not at {at!r}"


@pytest.mark.parametrize("change", ["pause", "remove", "update"])
async def test_a_change_made_while_a_run_is_queued_is_applied_when_it_settles(
    redis_url: str, namespace: str, r: redis.Redis, change: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, min_interval=0.05)
    runs: list[int] = []

    @app.task(name="build", queue="builds")
    async def build(n: int) -> None:
        runs.append(n)

    await app.aschedule("b", build, every=60, args=[1])
    await app.arun_now("b")
    await _queued_run(r, app, "b")
    keys = app.scheduler.shards[app.scheduler.homes("b")[-1]]
    assert r.zscore(keys.ready_of("builds"), RUN_PREFIX + "b") is not None
    info = await app.aget_schedule("b")
    assert info is not None and info.next_due_ms is None and info.args == [1]
    assert await app.arun_now("b") == 0, "a run is queued already"
    if change == "pause":
        assert await app.apause("b") == 1
    elif change == "remove":
        assert await app.aunschedule("b") == 1
    else:
        await app.aschedule("b", build, every=30, args=[2])
    assert await arun_until_idle(app, queues=["builds"]) == 1
    assert runs == [1], "the queued run ran, as it was queued"
    assert _where(r, app, "b") != QUEUED_AT.encode(), "settled"
    info = await app.aget_schedule("b")
    if change == "pause":
        assert info is not None and info.paused and info.runs == 1
    elif change == "remove":
        assert info is None and _where(r, app, "b") is None
        assert not r.hexists(keys.pending, "b")
    else:
        assert info is not None and info.args == [2] and info.cadence.every == 30
        assert info.generation == 2 and info.next_due_ms is not None and info.runs == 1
    assert not r.hexists(keys.jobs, RUN_PREFIX + "b") and not r.hexists(
        keys.state, RUN_PREFIX + "b"
    )
    await app.aclose()


def test_a_schedule_whose_kind_changes_moves_between_shards(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    """With schedule_shards > 1, a limited or routed schedule lives in the jobs' shard (with
    the limiter keys and the queues), a plain one in the shard its id hashes to."""
    app = drumbeat.App(redis_url, namespace=namespace, schedule_shards=3)
    app.task(name="tick")(lambda: None)
    store = app.scheduler
    sid = next(f"k{i}" for i in range(100) if store.shard_of(f"k{i}") != store.jobs_shard)
    hashed, jobs = store.shards[store.shard_of(sid)], store.shards[store.jobs_shard]
    assert app.schedule_many([drumbeat.Schedule(sid, "tick", every=60)]) == [1]
    assert r.hexists(hashed.where, sid) and not r.hexists(jobs.where, sid)
    limited = drumbeat.Schedule(sid, "tick", every=60, rate_limit="1/s")
    assert app.schedule_many([limited]) == [2]
    assert r.hexists(jobs.where, sid) and not r.hexists(hashed.where, sid)
    assert app.schedule_many([limited]) == [0]
    assert app.schedule_many([drumbeat.Schedule(sid, "tick", every=30)]) == [2]
    assert r.hexists(hashed.where, sid) and not r.hexists(jobs.where, sid)
    info = app.get_schedule(sid)
    assert info is not None and info.cadence.every == 30
    assert [i.id for i in app.schedules()] == [sid]
    assert app.pause(sid) == 1 and app.resume(sid) == 1 and app.unschedule(sid) == 1
    app.close()


async def test_the_worker_that_serves_its_queue_takes_the_run_as_its_job_unless_paused(
    app: drumbeat.App, r: redis.Redis
) -> None:
    """A time-slot run of a limited schedule becomes a job its own worker takes at once (it
    serves the queue): leased to it, never waiting in `ready` for a claim. In a paused queue it
    waits in `ready`; a run no longer in its slot is refused."""

    @app.task(name="tick")
    async def tick(i: int) -> None: ...

    limited = [
        drumbeat.Schedule(sid, "tick", every=3600, args=(i,), concurrency_limit=1)
        for i, sid in enumerate(("a", "b"))
    ]
    await app.aschedule_many(limited)
    assert await app.arun_now("a", "b") == 2
    keys = app.scheduler.shards[0]
    lane, (a, b) = await claim_due_runs(app, r, 2)
    slots, incarnation = SlotScripts(keys), lane.incarnation[0]

    def queue(run: Claimed) -> QueuedRuns:
        call = slots.queue_runs(incarnation, "default", [queue_item(run)], taker="w1",
                                lease_ms=30_000)  # fmt: skip
        return call.run(r)

    took = queue(a)
    assert took.statuses == [2]
    (job,) = took.taken
    assert (job.id, job.spec, job.attempt) == ("s:a", queue_item(a).record, 1)
    owner = r.hget(keys.owners, "s:a")
    assert owner is not None and owner.decode().split("|")[:2] == [str(job.token), "w1"]
    assert r.zscore(keys.leases, "s:a") is not None
    assert r.zcard(keys.ready_of("default")) == 0
    assert _where(r, app, "a") == QUEUED_AT.encode()

    await app.apause_queue("default")
    queued = queue(b)
    assert queued.statuses == [1] and queued.taken == []
    assert r.zrange(keys.ready_of("default"), 0, -1) == [b"s:b"]
    assert r.hget(keys.owners, "s:b") is None

    assert queue(a).statuses == [0], "sent again (a lost reply): no longer in its slot"
