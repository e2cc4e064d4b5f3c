"""The autoscaler's reads and writes against a real redis-server: the signal (one round trip)
and the supervisors' registrations."""

from __future__ import annotations

import asyncio
import json

import pytest

import drumbeat
from drumbeat.admin import lateness_summary
from drumbeat.autoscale import (
    RECENT_WINDOWS,
    Autoscaler,
    describe,
    plan,
    read_signal,
    run_calls,
    signal_calls,
    supervisor_ttl_ms,
)
from drumbeat.protocol import LATENESS_WINDOW_MS, LATENESS_WINDOWS
from tests.conftest import RedisServer, running_worker
from tests.helpers import wait_for_async


async def test_signal_counts_backlog_per_priority_due_entries_and_busy_slots(
    app: drumbeat.App,
) -> None:
    gate = asyncio.Event()

    @app.task(name="t.hold")
    async def hold() -> None:
        await gate.wait()

    jobs = [drumbeat.Prepared("t.x", [], {}, drumbeat.Options(priority=p)) for p in (0, 0, 4, 9)]
    jobs.append(drumbeat.Prepared("t.x", [], {}, drumbeat.Options(delay=0.05)))
    await app.aenqueue_many(jobs)
    await wait_for_async(lambda: asyncio.to_thread(read_signal, app),
                         until=lambda s: s.due_now == 1 and s.lag_ms > 0,
                         message="the delayed job should be due and not promoted")  # fmt: skip
    sig = read_signal(app)
    assert sig.ready_by_priority == (2, 0, 0, 0, 1, 0, 0, 0, 0, 1)
    assert sig.backlog == 5
    assert (sig.running, sig.slots, sig.workers) == (0, 0, 0)

    async with running_worker(app, concurrency=3):
        for _ in range(3):
            await app.aenqueue("t.hold")
        sig = await wait_for_async(
            lambda: asyncio.to_thread(read_signal, app),
            until=lambda s: s.running == 3 and s.slots == 3,
            message="three busy slots of one registered 3-slot worker",
        )
        assert sig.workers == 1
        gate.set()


async def test_supervisors_register_expire_and_deregister(app: drumbeat.App) -> None:
    a = Autoscaler(app, minimum=1, maximum=3, concurrency=4)
    b = Autoscaler(app, minimum=2, maximum=5, concurrency=4)
    assert a.look(live=1, desired=1, retiring=0, now=0.0) == 1
    assert b.look(live=2, desired=2, retiring=0, now=0.0) == 2
    sig = read_signal(app)
    by_id = {s.id: s for s in sig.supervisors}
    assert set(by_id) == {a.id, b.id}
    assert (by_id[b.id].minimum, by_id[b.id].maximum, by_id[b.id].live) == (2, 5, 2)
    assert by_id[a.id].slots == 4 and by_id[a.id].reason == "started at MIN (1)"

    b.close()
    assert {s.id for s in read_signal(app).supervisors} == {a.id}

    # A supervisor that stops beating (killed) is swept by the next beat past its ttl.
    ttl = supervisor_ttl_ms(app.settings.scale_interval)
    expired_ms = int(app.redis.time()[0]) * 1000 - 1000
    app.redis.zadd(app.keys.supervisors, {"gone.1.x": expired_ms})
    app.redis.hset(app.keys.supervisorinfo, "gone.1.x", json.dumps({"max": 9}))
    assert {s.id for s in read_signal(app).supervisors} == {a.id}, "a stale one is not live"
    run_calls(app.redis, [app.scripts.beat_supervisor(a.id, b'{"max": 3}', ttl)])
    assert app.redis.zscore(app.keys.supervisors, "gone.1.x") is None
    assert app.redis.hget(app.keys.supervisorinfo, "gone.1.x") is None
    a.close()
    assert app.redis.zcard(app.keys.supervisors) == 0


async def test_the_autoscaler_asks_for_more_processes_for_a_backlog(app: drumbeat.App) -> None:
    scaler = Autoscaler(app, minimum=1, maximum=4, concurrency=2)
    await app.aenqueue_many([drumbeat.Prepared("t.x", [], {}, drumbeat.Options())] * 5)
    assert scaler.look(live=1, desired=1, retiring=0, now=0.0) == 3
    assert "5 ready (p0 5)" in scaler.policy.reason
    assert "→ 3 processes in all, 3 here" in scaler.policy.reason
    # The registration carries the decision from the next beat on.
    scaler.look(live=3, desired=3, retiring=0, now=1.0)
    (me,) = read_signal(app).supervisors
    assert (me.live, me.desired, me.needed) == (3, 3, 3)
    assert me.reason_ms is not None and me.reason.startswith("5 ready")
    scaler.close()


async def test_without_redis_the_pool_stays_as_it_is(
    own_redis: RedisServer, namespace: str
) -> None:
    app = drumbeat.App(own_redis.url, namespace=namespace)
    scaler = Autoscaler(app, minimum=1, maximum=4, concurrency=2)
    try:
        await app.aenqueue_many([drumbeat.Prepared("t.x", [], {}, drumbeat.Options())] * 5)
        assert scaler.look(live=1, desired=1, retiring=0, now=0.0) == 3
        own_redis.halt()
        assert scaler.look(live=3, desired=3, retiring=0, now=1.0) == 3, "kept while Redis is away"
        # The supervisor's call hands the look to a thread and answers at once, with whatever
        # that thread last found (it may or may not have looked yet: not asserted, a race).
        scaler.decide(live=3, desired=3, retiring=0)
        await wait_for_async(
            lambda: scaler.decide(3, 3, 0),
            until=lambda n: n == 3,
            message="the thread's look keeps the pool when Redis is away",
        )
    finally:
        scaler.close()
        await app.aclose()


async def test_the_backlog_counts_every_queue_the_workers_serve(
    own_redis: RedisServer, namespace: str
) -> None:
    app = drumbeat.App(own_redis.url, namespace=namespace)

    @app.task(queue="builds")
    def build() -> None: ...

    @app.task
    def mail() -> None: ...

    try:
        for _ in range(3):
            await build.options(priority=2).aenqueue()
        await mail.aenqueue()
        await build.options(delay=0.001).aenqueue()
        await asyncio.sleep(0.05)  # due now, not yet promoted
        signal = read_signal(app)  # drumbeat status: every queue jobs went to
        assert signal.ready_by_priority[2] == 3 and signal.ready == 4
        assert signal.due_now == 1
        scaler = Autoscaler(app, minimum=1, maximum=4, concurrency=2, queues=["builds"])
        scaler.look(live=1, desired=1, retiring=0, now=0.0)
        assert scaler.last is not None and scaler.last.ready == 3, (
            "a supervisor of --queues builds should scale on that queue's backlog alone"
        )
        scaler.close()
    finally:
        await app.aclose()


async def test_a_look_in_flight_when_the_supervisor_stops_decides_nothing(
    app: drumbeat.App, caplog: pytest.LogCaptureFixture
) -> None:
    scaler = Autoscaler(app, minimum=1, maximum=4, concurrency=2)
    await app.aenqueue_many([drumbeat.Prepared("t.x", [], {}, drumbeat.Options())] * 5)
    scaler.close()  # the supervisor stops; a look already past its Redis call goes on
    with caplog.at_level("INFO", logger="drumbeat.autoscale"):
        assert scaler.look(live=1, desired=1, retiring=0, now=0.0) == 1
    assert scaler.policy.desired == 1 and not scaler.policy.changed
    assert not [r for r in caplog.records if "scaling to" in r.getMessage()], (
        "a stopping supervisor's autoscaler logged a scaling decision"
    )
    assert app.redis.zcard(app.keys.supervisors) == 0, "a closed autoscaler registered again"


async def test_a_lent_slot_is_one_busy_slot_though_it_holds_two_leases(
    redis_url: str, namespace: str
) -> None:
    """A run paused at a checkpoint keeps its lease while the urgent job it lent its slot to
    holds another: leases outnumber slots ("2 of 1 slots busy" before)."""
    app = drumbeat.App(redis_url, namespace=namespace, progress_interval=0.0, idle_block=0.5)
    release, paused = asyncio.Event(), asyncio.Event()

    @app.task(name="t.crawl", priority=0)
    async def crawl() -> None:
        while not release.is_set():
            await asyncio.sleep(0.01)
            paused.set()
            await drumbeat.acheckpoint()

    @app.task(name="t.urgent", priority=9)
    async def urgent() -> None:
        await release.wait()

    try:
        async with running_worker(app, concurrency=1) as worker:
            long = await crawl.aenqueue()
            await wait_for_async(lambda: paused.is_set() and worker.signals.subscribed.is_set(),
                                 message="the long run should start checkpointing")  # fmt: skip
            quick = await urgent.aenqueue()
            sig = await wait_for_async(
                lambda: asyncio.to_thread(read_signal, app),
                until=lambda s: s.running == 2,
                message="the lender and the urgent run in its lent slot should both hold a lease",
            )
            assert (sig.slots, sig.busy) == (1, 1)
            p = plan(sig, me="a", minimum=1, maximum=4, live=1, slots=1, concurrency=1,
                     rate=None, interval=1.0)  # fmt: skip
            text = describe(sig, p, None, None)
            assert "1 of 1 slots busy (+1 leases past them" in text, text
            release.set()
            await quick.aresult(timeout=20)
            await long.aresult(timeout=20)
    finally:
        release.set()  # a failed assertion must not leave the worker's stop waiting on them
        await app.aclose()


def test_the_signal_reads_only_the_recent_lateness_windows(app: drumbeat.App) -> None:
    """The ring holds 91 windows; a look every scale_interval reads the last RECENT_WINDOWS
    only (fields of older windows never come back), and its p99 is the one the whole ring
    gives for those windows."""
    r = app.redis
    sec, usec = r.time()
    window = (int(sec) * 1000 + int(usec) // 1000) // LATENESS_WINDOW_MS
    fields: dict[str, int] = {}
    for age in range(LATENESS_WINDOWS):  # every slot of the ring in use, the oldest first
        w = window - (LATENESS_WINDOWS - 1) + age
        slot = w % LATENESS_WINDOWS
        fields |= {f"w{slot}": w, f"m{slot}": 10 * age, f"b{slot}:{age % 40}": 5 + age}
    r.hset(app.keys.lateness, mapping=fields)
    (raw,) = run_calls(r, signal_calls(app))
    read = {k.decode(): v.decode() for k, v in zip(raw[5][::2], raw[5][1::2], strict=True)}
    recent = {f"{p}{w % LATENESS_WINDOWS}" for w in (window, window - 1) for p in "wm"}
    assert {k for k in read if k[0] in "wm"} == recent, sorted(read)
    assert len(read) == 6, f"read fields of other windows: {sorted(read)}"
    sig = read_signal(app)
    whole = lateness_summary(r.hgetall(app.keys.lateness), int(read[f"w{window % 91}"]) * 10_000,
                             windows=RECENT_WINDOWS)  # fmt: skip
    assert whole.runs == 5 + 90 + 5 + 89
    assert sig.lateness_p99_ms == whole.p99_ms


async def test_a_paused_queues_jobs_are_no_backlog_to_scale_for(
    own_redis: RedisServer, namespace: str
) -> None:
    """No worker takes a paused queue's jobs: more processes would not help. They are counted
    apart (`Signal.paused`), ready or due, and the autoscaler sizes the pool without them."""
    app = drumbeat.App(own_redis.url, namespace=namespace)

    @app.task(queue="builds")
    def build() -> None: ...

    @app.task
    def mail() -> None: ...

    try:
        assert await app.apause_queue("builds")
        for _ in range(6):
            await build.options(priority=2).aenqueue()
        await build.options(delay=0.001).aenqueue()
        await mail.aenqueue()
        await asyncio.sleep(0.05)  # the delayed build is due now, not yet promoted
        sig = read_signal(app)
        assert (sig.ready, sig.due_now, sig.lag_ms, sig.paused) == (1, 0, 0, 7), sig
        scaler = Autoscaler(app, minimum=1, maximum=8, concurrency=1)
        assert scaler.look(live=1, desired=1, retiring=0, now=0.0) == 1
        assert scaler.last is not None and scaler.last.paused == 7
        p = plan(scaler.last, me=scaler.id, minimum=1, maximum=8, live=1, slots=1,
                 concurrency=1, rate=None, interval=1.0)  # fmt: skip
        text = describe(scaler.last, p, None, None)
        assert text.startswith("1 ready (p0 1), 7 in paused queues, 0 of 0 slots busy"), text
        assert await app.aresume_queue("builds")
        assert scaler.look(live=1, desired=1, retiring=0, now=1.0) == 8, "resumed: 8 to run"
        assert read_signal(app).paused == 0
        scaler.close()
    finally:
        await app.aclose()


async def test_schedule_runs_are_no_backlog_while_the_default_queue_is_paused(
    app: drumbeat.App,
) -> None:
    @app.task
    async def tick() -> None: ...

    await app.apause_queue("default")
    app.schedule_many([drumbeat.Schedule(f"p{i}", tick, every=1) for i in range(5)])
    sig = await wait_for_async(
        lambda: asyncio.to_thread(read_signal, app),
        until=lambda s: s.paused == 5,
        message="the 5 runs due, held by the paused default queue",
    )
    assert (sig.backlog, sig.due_runs, sig.lag_ms) == (0, 0, 0), sig
    await app.aresume_queue("default")
    sig = read_signal(app)
    assert (sig.due_runs, sig.paused) == (5, 0) and sig.backlog == 5, sig
