"""Rate and concurrency limits on workers of the test's loop: options checked where they are
given, a limited job holding no slot and no attempt while it waits, permits released on a
hand-back, a named limiter shared by two tasks. Across worker processes (windows, load, kill -9):
tests/process/test_limits_process.py."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aredis

import drumbeat
from drumbeat.errors import InvalidJob
from drumbeat.job import decode_spec
from drumbeat.replies import Claimed
from drumbeat.script_sources import SOURCES
from drumbeat.testing import arun_until_idle
from drumbeat.worker.limiting import Gate
from tests.conftest import RedisServer, running_worker
from tests.helpers import wait_for_async


@pytest.fixture
async def lapp(redis_url: str, namespace: str) -> AsyncIterator[drumbeat.App]:
    app = drumbeat.App(redis_url, namespace=namespace, idle_block=0.5, maintenance_interval=0.2)
    yield app
    await app.aclose()


def test_bad_limits_are_refused_where_they_are_given(lapp: drumbeat.App) -> None:
    for rate, expected in [("0/s", "more than 0"), ("-3/s", "malformed"), ("5/d", "malformed"),
                           ("fast", "malformed"), ("", "malformed")]:  # fmt: skip
        with pytest.raises(InvalidJob, match=expected):
            lapp.task(name=f"r{len(rate)}", rate_limit=rate)(lambda: None)
    with pytest.raises(InvalidJob, match="limit_by='user' is not an argument of"):

        @lapp.task(concurrency_limit=1, limit_by="user")
        def place(user_id: int) -> None: ...

    with pytest.raises(InvalidJob, match="concurrency limit must be an int >= 1, got 0"):
        lapp.task(name="c0", concurrency_limit=0)(lambda: None)
    with pytest.raises(InvalidJob, match="rate_burst=3 needs a rate limit"):
        lapp.task(name="b3", rate_burst=3)(lambda: None)
    with pytest.raises(InvalidJob, match="limit_by='x' keys the task's own limits"):
        lapp.task(name="lb", limit_by="x")(lambda x: None)
    with pytest.raises(InvalidJob, match="needs rate= or concurrency="):
        lapp.limiter("empty")
    with pytest.raises(InvalidJob, match="limiter 'bad': rate limit 'bad/s' is malformed"):
        lapp.limiter("bad", rate="bad/s")

    @lapp.task(limiter="later")
    def fetch() -> None: ...

    @lapp.task(concurrency_limit=1, limit_by="user_id")
    def order(user_id: int, item: str = "") -> None: ...

    # A limiter may be declared after its tasks; a job is refused until it is.
    with pytest.raises(InvalidJob, match="names limiter 'later', which is not declared"):
        fetch.enqueue()
    with pytest.raises(InvalidJob, match="not declared"):
        drumbeat.Worker(lapp)
    with pytest.raises(InvalidJob, match="no value for limit_by argument 'user_id'"):
        order.enqueue(item="x")  # type: ignore[call-arg]
    with pytest.raises(InvalidJob, match=r"options\(\.\.\.\): rate limit '1/y' is malformed"):
        order.options(rate_limit="1/y")
    with pytest.raises(InvalidJob, match="limiter 'nope', which is not declared"):
        order.options(limiter="nope").enqueue(1)
    lapp.limiter("later", rate="5/s", concurrency=2)
    fetch.enqueue()
    order.enqueue(7)
    order.enqueue(user_id=8)


async def test_a_waiting_limited_job_takes_no_slot_and_no_attempt(
    lapp: drumbeat.App, r: redis.Redis
) -> None:
    """One slot: the second job of a concurrency-1 task waits in Redis while the first runs;
    an unlimited job enqueued after it still runs at once, and the waiting one runs later on
    its first attempt."""
    release = asyncio.Event()
    attempts: dict[str, int] = {}

    @lapp.task(concurrency_limit=1)
    async def held(tag: str) -> None:
        attempts[tag] = drumbeat.current_job().attempt
        if tag == "first":
            await release.wait()

    @lapp.task
    async def free() -> None:
        attempts["free"] = drumbeat.current_job().attempt

    first = await held.aenqueue("first")
    async with running_worker(lapp, concurrency=2):
        await wait_for_async(lambda: "first" in attempts, message="the first job should start")
        second = await held.aenqueue("second")
        await wait_for_async(
            lambda: r.zcard(lapp.keys.parked(f"t:{held.name}")) == 1,
            message="the second job should wait parked on the task's limiter key",
        )
        assert r.zscore(lapp.keys.leases, second.id) is None, "a parked job holds no lease"
        # The worker's other slot is free: an unlimited job runs while the limited one waits.
        other = await free.aenqueue()
        await wait_for_async(lambda: "free" in attempts, message="the unlimited job should run")
        assert await other.astatus() == "finished" or "free" in attempts
        assert await second.astatus() == "queued"
        assert "second" not in attempts
        release.set()
        await wait_for_async(lambda: "second" in attempts, message="the second should run next")
    assert attempts == {"first": 1, "free": 1, "second": 1}
    assert r.zcard(lapp.keys.permits(f"t:{held.name}")) == 0, "every permit is released"
    assert await first.aresult(timeout=5) is None


async def test_one_slot_worker_runs_an_unlimited_job_while_a_limited_one_waits(
    lapp: drumbeat.App, r: redis.Redis
) -> None:
    """A 1-slot worker: the limited job cannot start (its key's only permit is held elsewhere),
    and it must not keep the slot: the unlimited job behind it runs."""
    ran: list[str] = []

    @lapp.task(concurrency_limit=1)
    async def held() -> None:
        ran.append("held")

    @lapp.task
    async def free() -> None:
        ran.append("free")

    key = f"t:{held.name}"
    r.zadd(lapp.keys.permits(key), {"elsewhere": 9e15})  # a run on another worker holds it
    job = await held.aenqueue()
    await free.aenqueue()
    async with running_worker(lapp, concurrency=1):
        await wait_for_async(lambda: ran == ["free"], message="the unlimited job should run")
        state = r.hget(lapp.keys.state, job.id)
        assert state is not None and state.decode().startswith("0|"), "no attempt is counted"
        assert r.zscore(lapp.keys.parked(key), job.id) is not None
        r.zrem(lapp.keys.permits(key), "elsewhere")
        # Released as a run's end releases it: the parked job is moved on and runs.
        await lapp.scripts.release_limits(
            "", [key], queues=["default"], horizon_ms=200, lease_ms=30_000, batch=10
        ).arun(await lapp.aredis())
        await wait_for_async(lambda: ran == ["free", "held"], message="then the limited one")


async def test_a_named_limiter_is_shared_by_its_tasks(lapp: drumbeat.App, r: redis.Redis) -> None:
    lapp.limiter("shop", concurrency=2)
    running, peak, done = 0, 0, 0

    async def work() -> None:
        nonlocal running, peak, done
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        done += 1

    @lapp.task(limiter="shop")
    async def fetch_a() -> None:
        await work()

    @lapp.task(limiter="shop")
    async def fetch_b() -> None:
        await work()

    await lapp.aenqueue_many([t.prepare() for _ in range(10) for t in (fetch_a, fetch_b)])
    assert await arun_until_idle(lapp, concurrency=8, timeout=20) == 20
    assert peak == 2, f"at most 2 runs of the shared limiter at once, saw {peak}"
    assert r.zcard(lapp.keys.permits("n:shop")) == 0


def test_a_late_release_spares_the_permit_the_jobs_next_run_took(
    lapp: drumbeat.App, r: redis.Redis
) -> None:
    """A run's settle may reach Redis before its release, and the job's next run (a retry, a
    schedule's next run) be claimed and granted in between, taking the ended run's permit as
    its own: the late release must leave that permit, or the key lets one more run in (seen in
    CI: two runs of one user at once under concurrency 1)."""

    @lapp.task(concurrency_limit=1)
    def held(n: int) -> None: ...

    key = f"t:{held.name}"
    assert held.limits.own is not None
    limit = held.limits.own.args()
    s = lapp.scripts

    def claim() -> Claimed:
        [run] = s.claim("w", 1, 60_000, 100).run(r).jobs
        return run

    def acquire(run: Claimed) -> int:
        call = s.acquire_limits(run.id, run.token, queue="default", lease_ms=60_000,
                                horizon_ms=200, limits=[(key, limit)])  # fmt: skip
        return call.run(r)[0]

    def release(run: Claimed) -> None:
        s.release_limits(run.id, [key], token=run.token, queues=["default"], horizon_ms=200,
                         lease_ms=60_000, batch=10).run(r)  # fmt: skip

    job = held.enqueue(1)
    first = claim()
    assert acquire(first) == 1
    s.retry([(first.id, first.token, 0, 0)]).run(r)  # its run ended: it runs again at once
    second = claim()
    assert (second.id, second.token != first.token) == (job.id, True)
    assert acquire(second) == 1, "the next run takes the permit the ended run left"
    release(first)  # the first run's release, late
    assert r.zscore(lapp.keys.permits(key), job.id) is not None, "the running one's permit went"
    held.enqueue(2)
    other = claim()
    assert acquire(other) == 3, "a second run of the key started while one runs"
    release(second)
    assert r.zscore(lapp.keys.permits(key), job.id) is None, "a run's own release frees it"


async def test_a_hand_back_releases_the_permit(lapp: drumbeat.App, r: redis.Redis) -> None:
    """A run stopped at a checkpoint by the worker's shutdown is handed back: its permit goes
    with it, so the job waiting on the key runs on the next worker."""
    started: list[str] = []

    @lapp.task(concurrency_limit=1)
    async def long(tag: str) -> None:
        started.append(tag)
        if tag == "first" and len(started) == 1:
            while True:
                await drumbeat.acheckpoint()
                await asyncio.sleep(0.02)

    key = f"t:{long.name}"
    first = await long.aenqueue("first")
    async with running_worker(lapp, concurrency=2) as worker:
        # The second only once the first holds the permit: two jobs claimed together acquire
        # at once, in either order.
        await wait_for_async(lambda: started == ["first"], message="the first job should start")
        second = await long.aenqueue("second")
        await wait_for_async(
            lambda: r.zcard(lapp.keys.parked(key)) == 1, message="the second job should wait"
        )
        worker.stop()  # graceful: the first stops at its checkpoint and is handed back
    # Released: the permit went on to the waiting job (a ticket it runs on, without parking
    # again), which no longer waits on the key.
    permits = [m.decode() for m in r.zrange(lapp.keys.permits(key), 0, -1)]
    assert first.id not in permits, f"the first job's permit should be released: {permits}"
    assert r.zcard(lapp.keys.parked(key)) == 0
    assert await first.astatus() == "queued", "the first job should be handed back"
    assert second.id in permits or await second.astatus() == "complete"
    # Both run (the second may have been claimed by the stopping worker's last claim, before
    # its stop, and then runs there): the first once more, the second once.
    await arun_until_idle(lapp, concurrency=2)
    assert sorted(started) == ["first", "first", "second"]


async def test_parked_jobs_keep_priority_and_order_and_can_be_cancelled(
    lapp: drumbeat.App, r: redis.Redis
) -> None:
    """Jobs parked on a key move on best first (priority, then enqueue order), whatever order
    they parked in; a parked job can be cancelled; a call's own limits (Task.options) apply."""
    release = asyncio.Event()
    ran: list[str] = []

    @lapp.task
    async def step(tag: str) -> None:
        ran.append(tag)
        if tag == "blocker":
            await release.wait()

    one = step.options(concurrency_limit=1)  # the task has no limits: this call has
    await one.aenqueue("blocker")
    async with running_worker(lapp, concurrency=4):
        await wait_for_async(lambda: ran == ["blocker"], message="the blocker should start")
        low = [await one.aenqueue(f"low{i}") for i in range(3)]
        high = await step.options(concurrency_limit=1, priority=5).aenqueue("high")
        gone = await one.aenqueue("cancelled")
        key = f"t:{step.name}"
        await wait_for_async(
            lambda: r.zcard(lapp.keys.parked(key)) == 5, message="all five should park"
        )
        assert r.hget(lapp.keys.parking, "p|default") == b"5", "parked jobs are counted"
        assert await gone.acancel() is True
        assert await gone.astatus() == "cancelled"
        assert r.hget(lapp.keys.parking, "p|default") == b"4", "a cancelled one is counted off"
        await step.aenqueue("free")  # the task itself is unlimited
        await wait_for_async(lambda: "free" in ran, message="an unlimited call runs at once")
        release.set()
        await wait_for_async(lambda: len(ran) == 6, message="the parked jobs should all run")
    assert ran == ["blocker", "free", "high", "low0", "low1", "low2"]
    assert [await j.astatus() for j in (*low, high)] == ["complete"] * 4
    assert r.zcard(lapp.keys.parked(key)) == 0 and r.zcard(lapp.keys.permits(key)) == 0
    # release_limits drops the cancelled one's entry without counting it off again.
    assert r.hget(lapp.keys.parking, "p|default") == b"0"


@pytest.mark.parametrize("shards", [1, 3])
async def test_schedule_runs_are_limited_too(redis_url: str, namespace: str, shards: int) -> None:
    """With schedule_shards > 1 a limited schedule lives in the jobs' shard, with the limiter
    keys: one limiter holds for the runs of every such schedule (a limiter per shard would let
    each shard run one at once)."""
    lapp = drumbeat.App(redis_url, namespace=namespace, idle_block=0.5, min_interval=0.05,
                        schedule_shards=shards)  # fmt: skip
    running, peak, done = 0, 0, 0

    @lapp.task(concurrency_limit=1)
    async def poll(n: int) -> None:
        nonlocal running, peak, done
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        done += 1

    ids = [f"poll{i}" for i in range(12 if shards > 1 else 3)]
    for i, schedule_id in enumerate(ids):
        await lapp.aschedule(schedule_id, poll, every=0.1, args=[i])
    if shards > 1:
        scheduler = lapp.scheduler
        homes = {scheduler.home_of(lapp.redis, i) for i in ids}
        assert homes == {scheduler.jobs_shard}, "every limited schedule lives with the jobs"
        assert len({scheduler.shard_of(i) for i in ids}) > 1, "their ids hash to several shards"
    async with running_worker(lapp, concurrency=4):
        await wait_for_async(lambda: done >= 8, message="the schedules should run", timeout=20)
        await lapp.aunschedule(*ids)
    await lapp.aclose()
    assert peak == 1, f"at most one run of the concurrency-1 task at once, saw {peak}"


async def test_a_schedule_may_give_its_runs_limits_of_their_own(
    redis_url: str, namespace: str
) -> None:
    """`schedule(concurrency_limit=..., limit_by=...)` limits the runs of a task that has no
    limits: one run at a time per user, across the schedules of that user."""
    lapp = drumbeat.App(redis_url, namespace=namespace, idle_block=0.5, min_interval=0.05)
    running: dict[str, int] = {"a": 0, "b": 0}
    peak: dict[str, int] = {"a": 0, "b": 0}
    done = 0

    @lapp.task
    async def poll(user: str, n: int) -> None:
        nonlocal done
        running[user] += 1
        peak[user] = max(peak[user], running[user])
        await asyncio.sleep(0.05)
        running[user] -= 1
        done += 1

    for i, user in enumerate(["a", "a", "a", "b", "b"]):
        await lapp.aschedule(f"poll{i}", poll, every=0.1, args=[user, i], concurrency_limit=1,
                             limit_by="user")  # fmt: skip
    async with running_worker(lapp, concurrency=8):
        await wait_for_async(lambda: done >= 15, message="the schedules should run", timeout=20)
        await lapp.aunschedule(*[f"poll{i}" for i in range(5)])
    await lapp.aclose()
    assert peak == {"a": 1, "b": 1}, f"at most one run per user at once, saw {peak}"


def test_a_schedules_bad_limits_are_refused_when_it_is_made(lapp: drumbeat.App) -> None:
    @lapp.task
    def poll(user: str) -> None: ...

    with pytest.raises(InvalidJob, match="schedule 'p': limit_by='nobody' is not an argument"):
        lapp.schedule("p", poll, every=5, args=["a"], concurrency_limit=1, limit_by="nobody")
    with pytest.raises(InvalidJob, match="names limiter 'nowhere', which is not declared"):
        lapp.schedule("p", poll, every=5, args=["a"], limiter="nowhere")
    with pytest.raises(InvalidJob, match="rate limit 'fast' is malformed"):
        lapp.schedule("p", poll, every=5, args=["a"], rate_limit="fast")
    assert lapp.get_schedule("p") is None, "a refused schedule was stored"


async def test_jobs_claimed_together_acquire_their_limit_in_claim_order(lapp: drumbeat.App) -> None:
    """Jobs of one concurrency-1 key, claimed in one batch, take the permit in claim order
    (enqueue order): their acquisitions reach Redis in that order, every time, not by the luck
    of which of the client's connections answers first."""
    order: list[int] = []

    @lapp.task(concurrency_limit=1)
    async def step(n: int) -> None:
        order.append(n)

    async with running_worker(lapp, concurrency=8):
        for rounds in range(10):
            await lapp.aenqueue_many([step.prepare(8 * rounds + i) for i in range(8)])
            await wait_for_async(lambda r=rounds: len(order) >= 8 * (r + 1),
                                 message="the jobs did not run", timeout=20)  # fmt: skip
    assert order == sorted(order), f"a later job took the permit first: {order}"


def test_a_schedule_moves_to_the_jobs_shard_when_it_becomes_limited_and_back(
    redis_url: str, namespace: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, schedule_shards=2)

    @app.task
    async def poll(user: str) -> None: ...

    r, scheduler = app.redis, app.scheduler
    hashed = scheduler.shard_of("p")
    plain = drumbeat.Schedule("p", poll, every=60, args=["u"])
    limited = drumbeat.Schedule("p", poll, every=60, args=["u"], concurrency_limit=1,
                                limit_by="user")  # fmt: skip
    assert app.schedule_many([plain]) == [1]
    assert scheduler.home_of(r, "p") == hashed
    assert app.schedule_many([limited]) == [2], "moved where it lives now: updated"
    assert scheduler.home_of(r, "p") == scheduler.jobs_shard, "moved to the jobs' shard"
    assert not r.hexists(scheduler.shards[hashed].where, "p"), "one copy"
    info = app.get_schedule("p")
    assert info is not None and info.args == ["u"], "found where it lives now"
    assert app.pause("p") == 1 and app.resume("p") == 1 and app.run_now("p") == 1
    assert app.schedule_many([plain]) == [2], "unlimited again: moves back"
    assert scheduler.home_of(r, "p") == hashed
    assert not r.hexists(scheduler.shards[scheduler.jobs_shard].where, "p")
    assert not r.hexists(app.keys.state, "s:p"), "the run queued in the jobs' shard went with it"
    assert app.unschedule("p") == 1 and app.get_schedule("p") is None
    app.close()


async def test_a_sharded_run_of_a_task_that_gained_a_limit_is_told_per_shard(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The schedule was made while its task had no limit; the worker's task has one. The run
    still runs (under its shard's limiter), and the worker says once that the limit holds per
    shard."""
    before = drumbeat.App(redis_url, namespace=namespace, schedule_shards=2, min_interval=0.05)

    @before.task(name="poll")
    async def poll_unlimited(n: int) -> None: ...

    await before.aschedule("p", poll_unlimited, every=0.1, args=[1])
    await before.aclose()

    after = drumbeat.App(redis_url, namespace=namespace, schedule_shards=2, idle_block=0.5,
                         min_interval=0.05)  # fmt: skip
    ran = 0

    @after.task(name="poll", concurrency_limit=1)
    async def poll(n: int) -> None:
        nonlocal ran
        ran += 1

    with caplog.at_level("WARNING", logger="drumbeat.worker"):
        async with running_worker(after, concurrency=2):
            await wait_for_async(lambda: ran >= 3, message="the run should go on", timeout=20)
        await after.aunschedule("p")
    await after.aclose()
    told = [r.getMessage() for r in caplog.records if "holds per shard" in r.getMessage()]
    assert len(told) == 1, f"told once for the one limiter key, got {told}"
    assert "across the 3 shards" in told[0], told[0]  # 2 schedule shards and the main one


async def test_a_run_knows_the_start_its_rate_limit_granted(lapp: drumbeat.App) -> None:
    """`current_job().granted_ms` is the start the limiter granted each run (Redis clock): at
    50/s with burst 1, consecutive grants are at least the 20 ms interval apart (a property of
    the limiter, not of how fast the machine is); an unlimited run has none."""
    granted: dict[int, int | None] = {}
    early: list[float] = []

    @lapp.task(rate_limit="50/s")
    async def tick(n: int) -> None:
        granted[n] = at = drumbeat.current_job().granted_ms
        # Redis' TIME and time.time() read one clock here (one machine): no run starts before
        # the time it was granted (the worker's estimate of Redis' time is a lower bound).
        if at is not None and time.time() * 1000 < at:
            early.append(at - time.time() * 1000)

    @lapp.task
    async def free() -> None:
        granted[-1] = drumbeat.current_job().granted_ms

    n = 20
    await lapp.aenqueue_many([tick.prepare(i) for i in range(n)] + [free.prepare()])
    assert await arun_until_idle(lapp, concurrency=8, timeout=30) == n + 1
    assert granted.pop(-1) is None, "an unlimited run has no granted start"
    times = sorted(t for t in granted.values() if t is not None)
    assert len(times) == n, f"every rate-limited run should know its grant: {granted}"
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 20, f"grants closer than the 20 ms interval of 50/s: {gaps}"
    assert not early, f"runs started before their grant, by ms: {early}"


async def test_a_claimed_batch_acquires_in_one_round_trip_in_order(
    own_redis: RedisServer, namespace: str
) -> None:
    """The acquisitions of jobs claimed together reach Redis in claim order, sent together:
    one at a time (a round trip each) kept the order, but the runs of a batch then started a
    round trip apart and the worker claimed and settled about one job at a time (bench.limits:
    Redis commands per job 56 -> 74). Round trips are Redis' read events on a server of its
    own (a small pipeline arrives in one read)."""
    app = drumbeat.App(own_redis.url, namespace=namespace)

    @app.task(concurrency_limit=1)
    async def step(n: int) -> None: ...

    app.enqueue_many([step.prepare(i) for i in range(8)])
    r = redis.Redis.from_url(own_redis.url)
    client = aredis.Redis.from_url(own_redis.url)
    gate = Gate(app, [app.scripts], ["default"])
    gate.client = client
    try:
        claimed = app.scripts.claim("w", 8, 60_000, 100).run(r).jobs
        assert [decode_spec(j.spec or b"").args for j in claimed] == [[i] for i in range(8)]
        await gate.release(0, "", 0, [])  # the gate's connection and its set-up, before counting
        r.script_load(SOURCES["acquire_limits"])  # else every call's NOSCRIPT is retried alone
        keyed = gate.keys_of(step, decode_spec(claimed[0].spec or b""))
        reads = int(r.info("stats")["total_reads_processed"])
        replies = await asyncio.gather(
            *(gate.acquire(0, job, keyed, lambda: int(time.time() * 1000)) for job in claimed)
        )
        reads = int(r.info("stats")["total_reads_processed"]) - reads - 1  # less the INFO
        assert replies[0] is not None and replies[1:] == [None] * 7, (
            f"the first job claimed should take the only permit, the rest park: {replies}"
        )
        assert reads <= 2, f"8 acquisitions took {reads} round trips; expected 1 (2 if split)"
    finally:
        await gate.aclose()
        await client.aclose()
        r.close()
        await app.aclose()


async def test_acquisitions_waiting_on_a_cancelled_sender_are_cancelled(
    redis_url: str, namespace: str
) -> None:
    """The task that sends the waiting acquisitions is cancelled (the worker stops): the runs
    waiting for its replies are cancelled too, rather than wait forever."""
    app = drumbeat.App(redis_url, namespace=namespace)

    @app.task(concurrency_limit=1)
    async def step(n: int) -> None: ...

    app.enqueue_many([step.prepare(i) for i in range(3)])
    r = redis.Redis.from_url(redis_url)
    client = aredis.Redis.from_url(redis_url)
    gate = Gate(app, [app.scripts], ["default"])
    gate.client = client
    try:
        claimed = app.scripts.claim("w", 3, 60_000, 100).run(r).jobs
        keyed = gate.keys_of(step, decode_spec(claimed[0].spec or b""))
        runs = [asyncio.create_task(gate.acquire(0, job, keyed, lambda: 0)) for job in claimed]
        await asyncio.sleep(0)  # the runs ask; the sender is made, not yet run
        assert gate._sender is not None
        gate._sender.cancel()
        done = await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), 30)
        assert all(isinstance(x, asyncio.CancelledError) for x in done), done
    finally:
        await gate.aclose()
        await client.aclose()
        r.close()
        await app.aclose()
