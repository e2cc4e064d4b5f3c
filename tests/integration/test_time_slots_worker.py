"""A worker with schedules in the time slots: runs on cadence, never overlapping; a run whose
schedule changed meanwhile settles into the new definition; a graceful stop hands unfinished
runs back; a worker whose lease lapsed loses its runs to the reaper and goes on as a new
incarnation."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import AsyncIterator

import pytest
import redis

import drumbeat
from drumbeat import admin
from drumbeat.admin.schedules import schedule_stats
from drumbeat.autoscale import read_signal
from drumbeat.keys import Keys
from drumbeat.schedule import phase_ms
from drumbeat.schedules.changes import SlotChanges
from drumbeat.schedules.slots import SlotScripts, parse_entry
from drumbeat.scripts import Call
from drumbeat.worker.slotted import SlotLane
from tests.conftest import running_worker
from tests.helpers import wait_for_async

_APPS: list[drumbeat.App] = []


@pytest.fixture(autouse=True)
async def _close_apps() -> AsyncIterator[None]:
    """Closes the test's apps even when it fails before its own `aclose` (else their sockets
    warn in the next test's teardown)."""
    yield
    while _APPS:
        await _APPS.pop().aclose()


def _app(redis_url: str, namespace: str, **settings: object) -> drumbeat.App:
    app = drumbeat.App(redis_url, namespace=namespace, **settings)
    _APPS.append(app)
    return app


def _now_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def _entries(r: redis.Redis, keys: Keys) -> dict[str, str]:
    """Every schedule's entry waiting in a slot, by id."""
    out = {}
    for ms in r.zrange(keys.slots, 0, -1):
        for e in r.lrange(keys.slot(int(ms)), 0, -1):
            entry = parse_entry(e.decode(), int(ms))
            assert entry.schedule_id not in out, f"{entry.schedule_id} waits in two slots"
            out[entry.schedule_id] = entry.record
    return out


def _in_flight_keys(r: redis.Redis, keys: Keys) -> list[bytes]:
    """The incarnations' `inflight` sets and claim lists still in Redis."""
    prefixes = (keys.inflight("x")[:-1], keys.claimed("x", "1:2")[:-5])
    return [k for p in prefixes for k in r.scan_iter(p + "*")]


async def test_schedules_run_on_cadence_never_overlapping_from_time_slots(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = _app(redis_url, namespace)
    dues: defaultdict[str, list[int]] = defaultdict(list)
    active: set[str] = set()
    overlaps: list[str] = []
    early: list[int] = []

    @app.task
    async def monitor(n: int) -> None:
        ctx = drumbeat.current_job()
        assert ctx.schedule_id is not None and ctx.due_ms is not None
        if ctx.schedule_id in active:
            overlaps.append(ctx.schedule_id)
        active.add(ctx.schedule_id)
        if _now_ms(r) < ctx.due_ms:
            early.append(ctx.due_ms)
        await asyncio.sleep(0.05)
        dues[ctx.schedule_id].append(ctx.due_ms)
        active.discard(ctx.schedule_id)

    ids = [f"m{i}" for i in range(100)]
    codes = await app.aschedule_many(
        [drumbeat.Schedule(sid, monitor, every=1, args=(i,)) for i, sid in enumerate(ids)]
    )
    assert codes == [1] * 100
    # Registering again changes nothing.
    assert app.schedule_many(
        [drumbeat.Schedule(sid, monitor, every=1, args=(i,)) for i, sid in enumerate(ids)]
    ) == [0] * 100  # fmt: skip
    started = _now_ms(r)
    async with running_worker(app, concurrency=20):
        await wait_for_async(
            lambda: min(len(dues[sid]) for sid in ids),
            lambda least: least >= 3,
            message="every schedule should run 3 times",
            timeout=60,
        )
    stopped = _now_ms(r)
    assert not overlaps
    assert not early, "a run started before its due time"
    for sid, ds in dues.items():
        assert len(set(ds)) == len(ds), f"{sid} ran a slot twice: {sorted(ds)}"
        assert all((d - phase_ms(sid, 1000)) % 1000 == 0 for d in ds), (sid, ds)
        assert started - 1000 <= min(ds) and max(ds) <= stopped
    # Every schedule waits in a slot again, its runs counted, nothing held in flight.
    keys = Keys(namespace)
    records = _entries(r, keys)
    assert sorted(records) == sorted(ids)
    uncounted = {sid: (records[sid], sorted(dues[sid])) for sid in ids
                 if int(records[sid].split("|")[3]) < len(dues[sid])}  # fmt: skip
    assert not uncounted, f"runs that ran but were not counted: {uncounted}"
    assert not _in_flight_keys(r, keys)
    assert r.zcard(keys.runners) == 0  # the stopped worker gave its lease up
    await app.aclose()


async def test_a_lone_schedule_runs_on_every_slot(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    """A schedule alone in its shard settles into a slot that is in no list of upcoming slots
    its worker holds: the settle tells the claimer, whose wait would otherwise last its
    `idle_block` (2 s). Before, each run began about a second late and the next slot, then
    less than half an interval away, was skipped (coalesced into the late run)."""
    app = _app(redis_url, namespace)
    dues: list[int] = []

    @app.task
    async def tick() -> None:
        dues.append(drumbeat.current_job().due_ms or 0)

    await app.aschedule("alone", tick, every=1)
    async with running_worker(app):
        await wait_for_async(lambda: len(dues), lambda n: n >= 5, message="five runs")
    info = await app.aget_schedule("alone")
    assert info is not None and info.misfires == 0
    gaps = [b - a for a, b in itertools.pairwise(dues[:4])]
    assert gaps == [1000] * 3, f"slots skipped: {dues}"
    await app.aclose()


async def test_a_failing_run_keeps_its_schedule_and_its_error(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = _app(redis_url, namespace)
    runs: list[int] = []

    @app.task
    async def flaky() -> None:
        runs.append(1)
        raise RuntimeError("search site down")

    app.schedule("f", flaky, every=1)
    async with running_worker(app, concurrency=2):
        await wait_for_async(lambda: len(runs), lambda n: n >= 2, message="2 runs", timeout=30)
    keys = Keys(namespace)
    record = _entries(r, keys)["f"]
    assert int(record.split("|")[3]) >= 2 and int(record.split("|")[4]) >= 2  # runs, failures
    assert b"search site down" in r.hget(keys.faults, "f")
    await app.aclose()


async def test_runs_go_on_when_redis_forgets_its_scripts_between_a_claim_and_its_reads(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    # A claim sent again after NOSCRIPT runs after the reads of its lots that were sent with
    # it: they found nothing, and without reading its lots again the worker would never run
    # those runs (held in flight under a live lease, for ever).
    app = _app(redis_url, namespace)
    seen: defaultdict[str, int] = defaultdict(int)

    @app.task
    async def tick(i: int) -> None:
        seen[f"s{i}"] += 1

    app.schedule_many([drumbeat.Schedule(f"s{i}", tick, every=1, args=(i,)) for i in range(20)])
    async with running_worker(app, concurrency=50):
        for _ in range(8):
            r.script_flush()
            await asyncio.sleep(0.3)
        before = dict(seen)
        await wait_for_async(
            lambda: min(seen[f"s{i}"] - before.get(f"s{i}", 0) for i in range(20)),
            lambda least: least >= 2,
            message="every schedule runs on after its scripts were flushed",
            timeout=30,
        )
    await app.aclose()


async def test_a_schedule_changed_while_its_run_is_in_flight_continues_with_the_new_one(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = _app(redis_url, namespace)
    seen: list[tuple[int, ...]] = []
    running = asyncio.Event()
    release = asyncio.Event()

    @app.task
    async def watch(*args: int) -> None:
        seen.append(args)
        running.set()
        await release.wait()

    app.schedule("w", watch, every=1, args=(1,))
    async with running_worker(app, concurrency=2):
        await asyncio.wait_for(running.wait(), 30)
        assert await app.aschedule_many([drumbeat.Schedule("w", watch, every=2, args=(2,))]) == [2]
        release.set()
        await wait_for_async(lambda: seen, lambda s: (2,) in s, message="a run of the new one")
    assert seen[0] == (1,)
    keys = Keys(namespace)
    assert not r.exists(keys.pending)
    gen = int(_entries(r, keys)["w"].split("|")[0])
    assert gen == 2
    await app.aclose()


async def test_a_graceful_stop_hands_unfinished_runs_back_to_their_slot(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = _app(redis_url, namespace, shutdown_grace=0.5)
    started = asyncio.Event()

    @app.task
    async def slow() -> None:
        started.set()
        await asyncio.sleep(30)

    app.schedule("slow", slow, every=1)
    async with running_worker(app, concurrency=1):
        await asyncio.wait_for(started.wait(), 30)
    keys = Keys(namespace)
    # Handed back: waiting in a due slot, as claimed (no run counted), nothing in flight.
    slots = [int(ms) for ms in r.zrange(keys.slots, 0, -1)]
    assert len(slots) == 1 and slots[0] <= _now_ms(r)
    [entry] = r.lrange(keys.slot(slots[0]), 0, -1)
    assert parse_entry(entry.decode(), slots[0]).record.split("|")[3] == "0"
    assert not _in_flight_keys(r, keys)
    await app.aclose()


async def test_a_worker_whose_lease_lapsed_loses_its_runs_and_claims_as_a_new_incarnation(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = _app(redis_url, namespace)
    ran: list[tuple[str, int]] = []
    first = asyncio.Event()
    go_on = asyncio.Event()

    @app.task
    async def tick() -> None:
        ctx = drumbeat.current_job()
        ran.append((ctx.schedule_id or "", ctx.due_ms or 0))
        first.set()
        if len(ran) == 1:
            await go_on.wait()

    app.schedule("t", tick, every=1)
    keys = Keys(namespace)
    async with running_worker(app, concurrency=2) as worker:
        await asyncio.wait_for(first.wait(), 30)
        assert worker.lane is not None
        old = worker.lane.incarnation[0]
        # As if it froze past its lease: another worker's reaper takes its run back. Its
        # claims renew the lease meanwhile (so a reap may find it renewed), or its own reaper
        # may come first: the run is taken back once, by one of them.
        reaped = 0
        for _ in range(50):
            if r.zscore(keys.runners, old) is None:
                break
            r.zadd(keys.runners, {old: _now_ms(r) - 1}, xx=True)
            reaped += await worker.lane.reap(await app.aredis(), _now_ms(r))
        assert r.zscore(keys.runners, old) is None, "the lapsed incarnation was not reaped"
        assert reaped <= 1
        go_on.set()  # its run ends now: the settle is refused (the run comes again)
        await wait_for_async(
            lambda: worker.lane.incarnation[0] if worker.lane else old,
            lambda now: now != old,
            message="a new incarnation after the lapse",
            timeout=30,
        )
        await wait_for_async(lambda: len(ran), lambda n: n >= 3, message="runs go on", timeout=30)
    # The run of the lapsed lease ran again (at least once), and the schedule goes on.
    assert ran[1] == ran[0]
    assert int(_entries(r, keys)["t"].split("|")[3]) >= 2
    await app.aclose()


def test_schedules_are_read_back_as_they_were_registered(redis_url: str, namespace: str) -> None:
    app = _app(redis_url, namespace, schedule_shards=2)

    @app.task(name="tasks.watch")
    def watch(keyword: str, under: int = 0) -> None: ...

    app.schedule_many(
        [drumbeat.Schedule(f"m{i}", watch, every=60, args=(f"k{i}",), kwargs={"under": i})
         for i in range(12)]
        + [drumbeat.Schedule("nightly", watch, cron="0 3 * * *", args=("all",), priority=3)]
    )  # fmt: skip
    listed = {i.id: i for i in app.schedules()}
    assert sorted(listed) == sorted([*(f"m{i}" for i in range(12)), "nightly"])
    for i in range(12):
        info = listed[f"m{i}"]
        assert (info.task, info.args, info.kwargs, info.cadence.every, info.priority) == (
            "tasks.watch",
            [f"k{i}"],
            {"under": i},
            60,
            0,
        )
        assert (info.paused, info.runs, info.queue) == (False, 0, "default")
    nightly = listed["nightly"]
    assert (nightly.cadence.cron, nightly.args, nightly.priority) == ("0 3 * * *", ["all"], 3)
    for sid, info in listed.items():
        assert app.get_schedule(sid) == info
        assert info.next_due_ms is not None
    assert sorted(i.id for i in app.schedules("m1")) == ["m1", "m10", "m11"]
    assert app.get_schedule("nope") is None
    # Counted as `drumbeat status`, the dashboard and /metrics count them.
    assert app.scheduler.count(app.redis) == 13
    assert schedule_stats(app).total == 13
    app.close()


async def test_a_schedule_whose_run_is_in_flight_is_read_from_its_workers_lot(
    redis_url: str, namespace: str
) -> None:
    app = _app(redis_url, namespace)
    gate, started = asyncio.Event(), asyncio.Event()

    @app.task
    async def hold(word: str) -> None:
        started.set()
        await gate.wait()

    app.schedule("held", hold, every=1, args=("w",))
    async with running_worker(app, concurrency=2):
        await asyncio.wait_for(started.wait(), 30)
        info = await app.aget_schedule("held")
        assert info is not None and info.args == ["w"] and info.task.endswith("hold")
        assert info.next_due_ms is None  # in flight
        [listed] = await app.aschedules()
        assert listed.id == "held" and listed.next_due_ms is None
        gate.set()
        await wait_for_async(
            lambda: app.aget_schedule("held"),
            lambda i: i is not None and i.runs >= 1 and i.next_due_ms is not None,
            message="settled: waiting in its next slot, its run counted",
        )
    await app.aclose()


def test_a_removed_schedule_is_gone(redis_url: str, namespace: str) -> None:
    app = _app(redis_url, namespace)

    @app.task
    def t() -> None: ...

    app.schedule("a", t, every=5)
    assert app.unschedule("a") == 1
    assert app.unschedule("a") == 0
    assert app.get_schedule("a") is None
    app.close()


async def test_jobs_run_beside_time_slot_schedules(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = _app(redis_url, namespace)
    ticks: list[int] = []
    done: list[int] = []

    @app.task
    async def tick(i: int) -> None:
        ticks.append(i)

    @app.task
    async def job(i: int) -> None:
        done.append(i)

    app.schedule_many([drumbeat.Schedule(f"t{i}", tick, every=1, args=(i,)) for i in range(50)])
    async with running_worker(app, concurrency=10):
        await wait_for_async(lambda: len(ticks), lambda n: n >= 50, message="schedules run")
        for i in range(20):  # while the worker is busy with, or waiting for, schedule runs
            await job.aenqueue(i)
            await asyncio.sleep(0.03)
        await wait_for_async(lambda: sorted(done), lambda d: d == list(range(20)), message="jobs")
    await app.aclose()


# A record that is no record, and one with every field whose grid slot is not a number.
@pytest.mark.parametrize("record", ["not a record", "1|soon|5|0|0|0||0|0|1|[[],5]"])
async def test_an_unreadable_record_is_reported_and_kept_not_lost(
    redis_url: str, namespace: str, r: redis.Redis, record: str
) -> None:
    app = _app(redis_url, namespace)
    ticks: list[int] = []

    @app.task
    async def tick() -> None:
        ticks.append(1)

    app.schedule("ok", tick, every=1)
    keys = Keys(namespace)
    due = _now_ms(r) - 5
    r.rpush(keys.slot(due), f"broken|{record}")
    r.zadd(keys.slots, {str(due): due})
    r.hset(keys.where, "broken", due)
    async with running_worker(app, concurrency=2):
        await wait_for_async(
            lambda: r.hget(keys.faults, "broken"), lambda f: f is not None, message="reported"
        )
        await wait_for_async(lambda: len(ticks), lambda n: n >= 2, message="the other runs")
    assert b"unreadable schedule record" in r.hget(keys.faults, "broken")
    # Back in a later slot as it was, for whoever mends it; the other schedule ran on.
    later = _entries(r, keys)
    if "|" not in record:
        assert later["broken"] == record
    else:  # its fields kept, the slot it went back to as its grid (and the failure counted)
        gen, grid, *_, task, spec = later["broken"].split("|")
        assert (gen, task, spec) == ("1", "1", "[[],5]") and grid.isdigit(), later["broken"]
    assert int(later["ok"].split("|")[3]) >= 1
    await app.aclose()


def test_schedule_many_writes_at_most_batch_limit_schedules_a_call(
    redis_url: str, namespace: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _app(redis_url, namespace, batch_limit=10)

    @app.task
    def t(i: int) -> None: ...

    sizes: list[int] = []
    upsert = SlotChanges.upsert

    def counted(self: SlotChanges, client: redis.Redis, items: list) -> list[int]:  # type: ignore[type-arg]
        sizes.append(len(items))
        return upsert(self, client, items)

    monkeypatch.setattr(SlotChanges, "upsert", counted)
    assert (
        app.schedule_many([drumbeat.Schedule(f"c{i}", t, every=5, args=(i,)) for i in range(25)])
        == [1] * 25
    )
    assert sizes == [10, 10, 5]
    assert len(_entries(r, Keys(namespace))) == 25
    app.close()


async def test_a_stopping_worker_keeps_its_lease_while_it_still_holds_runs(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = _app(redis_url, namespace)
    keys = Keys(namespace)
    lane = SlotLane("w", [keys], app.settings, [0])
    incarnation = lane.incarnation[0]
    r.zadd(keys.runners, {incarnation: _now_ms(r) + 60_000})
    r.hset(keys.inflight(incarnation), mapping={"1:5": 7, "2:6": 8})
    r.rpush(keys.claimed(incarnation, "1:5"), "s1|rec")
    r.rpush(keys.claimed(incarnation, "2:6"), "s2|rec")
    lane.claims[0].took("1:5", 1)  # one run of lot 1:5 not settled (a hand-back that failed)
    client = await app.aredis()
    await lane.deregister(client)
    assert r.zscore(keys.runners, incarnation) is not None  # the reaper will find it
    assert r.exists(keys.claimed(incarnation, "1:5"))
    lane.claims[0].done("1:5")
    await lane.deregister(client)
    assert r.zscore(keys.runners, incarnation) is None
    assert not _in_flight_keys(r, keys)  # its claim lists went with it
    await app.aclose()


async def test_runs_whose_settle_redis_refuses_go_back_to_their_slot_and_run_again(
    redis_url: str, namespace: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _app(redis_url, namespace)
    runs: list[int] = []

    @app.task
    async def tick() -> None:
        runs.append(1)

    settle = SlotScripts.settle
    broken: list[int] = []

    def refused_once(
        self: SlotScripts,
        incarnation: str,
        items: list,
        drops: list,  # type: ignore[type-arg]
    ) -> Call:  # type: ignore[type-arg]
        call = settle(self, incarnation, items, drops)
        if broken:
            return call
        broken.append(1)  # ARGV[2], the runs' count, unreadable: the script fails
        return Call(call.name, call.keys, [call.args[0], "x", *call.args[2:]], call.parse)

    monkeypatch.setattr(SlotScripts, "settle", refused_once)
    app.schedule("t", tick, every=1)
    async with running_worker(app, concurrency=2):
        # The first run's settle fails for good; without the hand-back the schedule would stay
        # in flight (its worker's lease lives on) and never run again.
        await wait_for_async(lambda: len(runs), lambda n: n >= 3, message="runs go on", timeout=30)
    assert broken == [1]
    assert "t" in _entries(r, Keys(namespace))
    await app.aclose()


async def test_schedules_spread_over_schedule_shards_run_from_every_shards_slots(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = _app(redis_url, namespace, schedule_shards=2)
    seen: defaultdict[str, int] = defaultdict(int)

    @app.task
    async def tick(sid: str) -> None:
        seen[sid] += 1

    ids = [f"x{i}" for i in range(40)]
    app.schedule_many([drumbeat.Schedule(sid, tick, every=1, args=(sid,)) for sid in ids])
    shards = {app.scheduler.shard_of(sid) for sid in ids}
    assert shards == {0, 1}
    async with running_worker(app, concurrency=10) as worker:
        assert worker.lane is not None
        first = list(worker.lane.incarnation)
        await wait_for_async(lambda: min(seen[s] for s in ids), lambda n: n >= 2, message="runs")
        # Each shard registered its own incarnation once: none was taken for a reaped one.
        assert worker.lane.incarnation == first
    assert app.unschedule(*ids) == 40
    await app.aclose()


async def test_the_scale_signal_counts_busy_time_slot_runs(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = _app(redis_url, namespace)
    gate = asyncio.Event()
    started: list[str] = []

    @app.task
    async def hold(sid: str) -> None:
        started.append(sid)
        await gate.wait()

    app.schedule_many(
        [drumbeat.Schedule(f"h{i}", hold, every=1, args=(f"h{i}",)) for i in range(3)]
    )
    keys = Keys(namespace)
    async with running_worker(app, concurrency=5) as worker:
        await wait_for_async(lambda: len(started), lambda n: n == 3, message="3 runs hold")
        # No leases: the runs are held by the worker's incarnation, which counts them in
        # `busy` as it claims (the signal sees them at once, not at the next heartbeat).
        assert worker.lane is not None
        assert r.hgetall(keys.busy) == {worker.lane.incarnation[0].encode(): b"3"}
        raw = app.scripts.scale_signal(60_000, False).run(r)
        assert raw[4] == 3  # leases (none) and time-slot runs held
        sig = await wait_for_async(
            lambda: asyncio.to_thread(read_signal, app),
            until=lambda s: s.slots == 5,
            message="the worker's registration",
        )
        assert sig.running == 3 and sig.busy == 3
        assert admin.queue_stats(app).running_total == 3, "drumbeat status counts them running"
        gate.set()
        await wait_for_async(
            lambda: r.hgetall(keys.busy), lambda held: not held, message="no runs held"
        )
    await app.aclose()


async def test_the_scale_signal_sees_time_slot_runs_waiting(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = _app(redis_url, namespace)

    @app.task
    async def tick() -> None: ...

    app.schedule_many([drumbeat.Schedule(f"w{i}", tick, every=1) for i in range(20)])
    # No worker: within a second every schedule's first slot is due and waits. Every slot
    # due, the estimate (due slots x runs per slot) is exact: runs, not slots.
    sig = await wait_for_async(
        lambda: asyncio.to_thread(read_signal, app),
        until=lambda s: s.due_runs == 20,
        message="the 20 runs due, counted as runs (not as the slots that hold them)",
    )
    assert sig.backlog == 20 and sig.lag_ms > 0, sig
    assert not sig.waiting_for_slots, "no worker: no slots to wait for"
    await app.aclose()


async def test_the_scale_signal_says_when_due_runs_wait_for_free_slots(
    redis_url: str, namespace: str
) -> None:
    app = _app(redis_url, namespace)
    gate = asyncio.Event()

    @app.task
    async def hold() -> None:
        await gate.wait()

    app.schedule_many([drumbeat.Schedule(f"h{i}", hold, every=1) for i in range(10)])
    try:
        async with running_worker(app, concurrency=1):
            # One slot, held by the first run: the other nine come due and wait for it.
            sig = await wait_for_async(
                lambda: asyncio.to_thread(read_signal, app),
                until=lambda s: s.due_runs >= 9 and s.busy == 1,
                message="nine runs due behind the one that holds the only slot",
            )
            assert sig.waiting_for_slots and sig.slots == 1, sig
            gate.set()
    finally:
        gate.set()
        await app.aclose()
