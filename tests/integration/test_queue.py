"""The queue's behaviour on a real Redis: priorities, slots, delays, retries, dedup, results."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

import drumbeat
from drumbeat.protocol import MAX_PRIORITY, PRIORITY_SPAN
from drumbeat.scripts import Call
from drumbeat.testing import arun_until_idle
from tests.conftest import RedisServer, reap_call, running_worker
from tests.helpers import blocked_in, commands, entries, leased, wait_for_async


async def _idle_in(r: redis.Redis, command: str, seconds: int, what: str) -> None:
    """Waits until a client has sat in one blocking ``command`` for at least ``seconds``: that
    client sent nothing meanwhile (a poller would have), and the server-wide counters read
    before and after bracket that stretch. (Redis counts ``idle`` in whole seconds of its
    clock, so ``idle > seconds`` is what proves ``seconds`` passed.)"""
    await wait_for_async(
        lambda: [int(c["idle"]) for c in blocked_in(r, command)],
        lambda idle: bool(idle) and max(idle) > seconds,
        message=f"{what} should stay blocked in {command} for {seconds} s (idle seconds)",
    )


async def test_strict_priority_and_fifo_within_a_level(app: drumbeat.App) -> None:
    order: list[tuple[int, int]] = []

    @app.task
    async def record(prio: int, n: int) -> None:
        order.append((prio, n))

    plan = [(p, n) for n in range(5) for p in (0, 9, 3, 5, 3)]
    await app.aenqueue_many(
        [record.options(priority=p).prepare(p, i) for i, (p, _) in enumerate(plan)]
    )
    assert await arun_until_idle(app, concurrency=1) == len(plan)
    prios = [p for p, _ in order]
    assert prios == sorted(prios, reverse=True)
    for level in {p for p, _ in plan}:
        seen = [n for p, n in order if p == level]
        assert seen == sorted(seen), f"level {level} not FIFO: {seen}"


async def test_worker_holds_no_more_claims_than_free_slots(
    app: drumbeat.App, r: redis.Redis
) -> None:
    release = asyncio.Event()
    started: list[str] = []

    @app.task
    async def slow(name: str) -> None:
        started.append(name)
        await release.wait()

    @app.task
    async def quick(name: str) -> None:
        started.append(name)

    await app.aenqueue_many([slow.prepare(f"low{i}") for i in range(6)])
    async with running_worker(app, concurrency=2):
        await wait_for_async(lambda: started, lambda s: len(s) >= 2, message="two slots fill")
        # No settle time needed: the worker claims, starts what it took and parks on its full
        # slots in one step of the loop, before either job runs a line. A claim made later
        # would start its jobs at once, ahead of `urgent`: the index check below sees it.
        assert leased(r, app.keys.leases) == 2, "a busy worker prefetched past its free slots"
        assert r.zcard(app.keys.ready) == 4
        urgent = await quick.options(priority=9).aenqueue("urgent")
        release.set()
        assert await urgent.aresult(timeout=5) is None
        await wait_for_async(lambda: started, lambda s: len(s) >= 7, message="all seven run")
    # The urgent job was enqueued after six low ones, yet starts with the first freed slot.
    assert started.index("urgent") == 2


async def test_delayed_and_at_jobs_run_on_time_by_redis_clock(
    own_redis: RedisServer, namespace: str, own_r: redis.Redis
) -> None:
    r = own_r  # its own server: the only client blocked there is this test's worker
    # A long idle block: a worker that missed the wake-up for a delayed job would be ~5 s late.
    app = drumbeat.App(own_redis.url, namespace=namespace, idle_block=5.0)
    starts: dict[str, float] = {}

    @app.task
    async def mark(name: str) -> None:
        starts[name] = _redis_now(r)

    async with running_worker(app, concurrency=4):
        await wait_for_async(
            lambda: blocked_in(r, "bzpopmin"), message="the worker should be idle and blocked"
        )
        t0 = _redis_now(r)
        await mark.options(delay=0.4).aenqueue("delay")
        at = datetime.fromtimestamp(t0, UTC) + timedelta(seconds=0.6)
        job = await mark.options(at=at).aenqueue("at")
        assert await job.astatus() is drumbeat.JobStatus.SCHEDULED
        await job.aresult(timeout=5)
        await wait_for_async(lambda: "delay" in starts, message="the delayed job should run")
    assert starts["delay"] >= t0 + 0.4
    assert starts["at"] >= t0 + 0.6
    # Far under the 5 s idle block: the enqueue woke the blocked worker to re-arm its timer.
    assert starts["delay"] - (t0 + 0.4) < 1.0
    assert starts["at"] - (t0 + 0.6) < 1.0
    await app.aclose()


def _redis_now(r: redis.Redis) -> float:
    sec, usec = r.time()
    return sec + usec / 1e6


async def test_retries_with_backoff_then_dead_letter(app: drumbeat.App, r: redis.Redis) -> None:
    attempts: list[tuple[int, float]] = []

    @app.task(retries=2, backoff=0.2, backoff_max=10)
    async def flaky() -> None:
        attempts.append((drumbeat.current_job().attempt, time.monotonic()))
        raise RuntimeError("boom")

    async with running_worker(app):
        job = await flaky.aenqueue()
        with pytest.raises(drumbeat.JobFailed) as info:
            await job.aresult(timeout=10)
    assert [a for a, _ in attempts] == [1, 2, 3]
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(attempts)]
    # Equal jitter: the n-th retry waits between half and all of backoff * 2**(n-1).
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2
    assert "RuntimeError: boom" in info.value.error
    assert info.value.traceback and "raise RuntimeError" in info.value.traceback
    assert await job.astatus() is drumbeat.JobStatus.DEAD
    assert r.zscore(app.keys.dead, job.id) is not None
    assert r.hexists(app.keys.errors, job.id)
    assert r.hexists(app.keys.jobs, job.id), "the record stays so the job can be retried"
    assert leased(r, app.keys.leases) == 0 and entries(r, app.keys.owners) == 0


async def test_retry_request_and_timeout(app: drumbeat.App) -> None:
    seen: list[int] = []

    @app.task(retries=1)
    async def again() -> int:
        attempt = drumbeat.current_job().attempt
        seen.append(attempt)
        if attempt == 1:
            raise drumbeat.Retry(delay=0.05)
        return attempt

    @app.task(timeout=0.2)
    async def stuck() -> None:
        await asyncio.sleep(30)

    @app.task(timeout=0.2)
    def stuck_sync() -> None:
        time.sleep(0.6)

    async with running_worker(app):
        assert await (await again.aenqueue()).aresult(timeout=5) == 2
        for t in (stuck, stuck_sync):
            with pytest.raises(drumbeat.JobFailed, match=r"timed out after 0\.2 s"):
                await (await t.aenqueue()).aresult(timeout=5)
    assert seen == [1, 2]


async def test_sync_tasks_see_their_context(app: drumbeat.App) -> None:
    @app.task
    def whoami() -> list[object]:
        ctx = drumbeat.current_job()
        return [ctx.job_id, ctx.attempt, ctx.token, ctx.task]

    async with running_worker(app):
        job = await whoami.aenqueue()
        job_id, attempt, token, task = await job.aresult(timeout=5)
    assert (job_id, attempt, task) == (job.id, 1, whoami.name)
    assert isinstance(token, int) and token > 0
    with pytest.raises(LookupError):
        drumbeat.current_job()


async def test_dedup_key_while_pending_or_running(app: drumbeat.App, r: redis.Redis) -> None:
    gate = asyncio.Event()

    @app.task
    async def build(n: int) -> int:
        await gate.wait()
        return n

    first = await build.options(key="build-42").aenqueue(1)
    again = await build.options(key="build-42").aenqueue(2)
    assert first.created and not again.created and again.id == first.id
    batch = await app.aenqueue_many([build.options(key="k2").prepare(i) for i in range(3)])
    assert len({j.id for j in batch}) == 1 and [j.created for j in batch] == [True, False, False]
    async with running_worker(app):
        await wait_for_async(
            first.astatus,
            lambda status: status is drumbeat.JobStatus.RUNNING,
            message="the first build should be running",
        )
        running_dup = await build.options(key="build-42").aenqueue(3)
        assert running_dup.id == first.id, "a running job still holds its key"
        gate.set()
        assert await first.aresult(timeout=5) == 1
        after = await build.options(key="build-42").aenqueue(4)
        assert after.created and after.id != first.id
        assert await after.aresult(timeout=5) == 4
    assert not r.hexists(app.keys.uniq, "build-42")


async def test_results_are_kept_for_their_ttl_then_swept(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, maintenance_interval=0.1)

    @app.task(result_ttl=0.5)
    async def short() -> str:
        return "soon gone"

    @app.task(result_ttl=0)
    async def unkept() -> str:
        return "never stored"

    @app.task
    async def kept() -> dict[str, int]:
        return {"a": 1}

    async with running_worker(app):
        j1, j2, j3 = (await short.aenqueue(), await unkept.aenqueue(), await kept.aenqueue())
        assert await j1.aresult(timeout=5) == "soon gone"
        assert await j3.aresult(timeout=5) == {"a": 1}
        await wait_for_async(
            lambda: (r.hexists(app.keys.results, j1.id), r.zscore(app.keys.expires, j1.id)),
            lambda kept: kept == (False, None),
            message="j1's outcome should be swept once its 0.5 s passed (in results, expiry)",
        )
        await wait_for_async(
            lambda: r.hexists(app.keys.jobs, j2.id),
            lambda kept: not kept,
            message="the unkept job's record should be gone",
        )
    assert await j2.astatus() is drumbeat.JobStatus.MISSING
    assert not r.hexists(app.keys.results, j1.id), "expired outcome was not swept"
    assert r.zscore(app.keys.expires, j1.id) is None
    assert not r.exists(app.keys.done(j1.id))
    with pytest.raises(drumbeat.JobNotFound):
        await j1.aresult(timeout=1)
    with pytest.raises(drumbeat.JobNotFound):
        await j2.aresult(timeout=1)
    assert r.hexists(app.keys.results, j3.id)
    # Every finished job's record is gone; only outcomes (indexed in `expires`) remain.
    assert entries(r, app.keys.jobs) == 0 and entries(r, app.keys.state) == 0
    await app.aclose()


async def test_result_waits_in_redis_without_polling(
    own_app: drumbeat.App, own_r: redis.Redis
) -> None:
    app, r = own_app, own_r  # its own server: nothing else moves the command counts

    @app.task
    async def later() -> int:
        return 7

    job = await later.aenqueue()
    waiter = asyncio.create_task(job.aresult(timeout=30))
    await wait_for_async(lambda: blocked_in(r, "blmove"), message="the waiter should block")
    before = commands(r, "evalsha"), commands(r, "blmove")
    await _idle_in(r, "blmove", 1, "the waiter")
    # No worker runs: a polling waiter would have read the status again meanwhile.
    assert (commands(r, "evalsha"), commands(r, "blmove")) == before
    async with running_worker(app):
        assert await waiter == 7


async def test_only_outcomes_someone_waits_for_are_announced(
    app: drumbeat.App, r: redis.Redis
) -> None:
    gate = asyncio.Event()

    @app.task
    async def work(n: int) -> int:
        if n == 2:
            await gate.wait()
        return n

    async with running_worker(app):
        unwatched = await work.aenqueue(1)
        await wait_for_async(
            unwatched.astatus,
            lambda status: status is drumbeat.JobStatus.COMPLETE,
            message="the unwatched job should complete",
        )
        assert not r.exists(app.keys.done(unwatched.id)), "nobody waited: nothing to announce"
        assert await unwatched.aresult(timeout=1) == 1  # read straight from `results`

        watched = await work.aenqueue(2)
        waiter = asyncio.create_task(watched.aresult(timeout=10))
        await wait_for_async(
            lambda: r.zscore(app.keys.waiting, watched.id),
            lambda mark: mark is not None,
            message="the waiter should mark the job as waited for",
        )
        gate.set()
        assert await asyncio.wait_for(waiter, 5) == 2
    assert 0 < r.pttl(app.keys.done(watched.id)) <= 3600_000, "kept as long as the outcome"
    assert r.zscore(app.keys.waiting, watched.id) is None, "the mark goes once announced"


async def test_a_dead_letter_is_announced_to_its_waiter(app: drumbeat.App, r: redis.Redis) -> None:
    gate = asyncio.Event()

    @app.task(retries=0)
    async def doomed() -> None:
        await gate.wait()
        raise RuntimeError("no luck")

    async with running_worker(app):
        job = await doomed.aenqueue()
        waiter = asyncio.create_task(job.aresult(timeout=10))
        await wait_for_async(
            lambda: r.zscore(app.keys.waiting, job.id),
            lambda mark: mark is not None,
            message="the waiter should mark the job as waited for",
        )
        gate.set()
        with pytest.raises(drumbeat.JobFailed, match="no luck"):
            await asyncio.wait_for(waiter, 5)
    assert r.lrange(app.keys.done(job.id), 0, -1) == [b"0"]
    assert r.zscore(app.keys.waiting, job.id) is None


def test_marks_of_waiters_that_gave_up_are_swept(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task
    def never_run() -> None: ...

    job = never_run.enqueue()
    with pytest.raises(drumbeat.ResultTimeout):
        job.result(timeout=0.2)
    mark = r.zscore(app.keys.waiting, job.id)
    assert mark is not None
    reap_call(app).run(r)
    assert r.zscore(app.keys.waiting, job.id) == mark, "not yet past its time"
    r.zadd(app.keys.waiting, {job.id: 1})  # as if its time had passed
    reap_call(app).run(r)
    assert r.zscore(app.keys.waiting, job.id) is None


def test_sync_api(app: drumbeat.App) -> None:
    @app.task
    def double(x: int) -> int:
        return 2 * x

    job = double.enqueue(21)
    assert job.status() is drumbeat.JobStatus.QUEUED
    with pytest.raises(drumbeat.ResultTimeout):
        job.result(timeout=0.2)

    async def drain() -> None:
        async with running_worker(app):
            await job.aresult(timeout=5)
        await app.aclose()

    asyncio.run(drain())
    assert job.result(timeout=1) == 42
    assert job.status() is drumbeat.JobStatus.COMPLETE
    assert app.job(job.id).result() == 42


async def test_revived_dead_job_runs_again_and_its_waiter_blocks(
    own_app: drumbeat.App, own_r: redis.Redis
) -> None:
    app, r = own_app, own_r  # its own server: nothing else moves the command counts
    fail = [True]

    @app.task
    async def once() -> str:
        if fail[0]:
            raise RuntimeError("first time")
        return "ok"

    async with running_worker(app):
        job = await once.aenqueue()
        with pytest.raises(drumbeat.JobFailed):
            await job.aresult(timeout=5)
    assert app.scripts.revive([job.id]).run(r) == [1, 0, 0]
    assert await job.astatus() is drumbeat.JobStatus.QUEUED
    waiter = asyncio.create_task(job.aresult(timeout=30))
    await wait_for_async(lambda: blocked_in(r, "blmove"), message="the waiter should block")
    before = commands(r, "blmove")
    await _idle_in(r, "blmove", 1, "the waiter of the revived job")
    assert commands(r, "blmove") == before, "the old failure announcement woke the waiter"
    assert not waiter.done(), "the old failure announcement ended the wait"
    fail[0] = False
    async with running_worker(app):
        assert await waiter == "ok"


async def test_expired_outcomes_are_swept_faster_than_one_batch_per_interval(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    # 10 per batch, one pass a second: 200 outcomes would take 20 s without back-to-back sweeps.
    app = drumbeat.App(redis_url, namespace=namespace, batch_limit=10, maintenance_interval=1.0)

    @app.task(result_ttl=0.3)
    async def noop(n: int) -> int:
        return n

    async with running_worker(app, concurrency=50):
        jobs = await app.aenqueue_many([noop.prepare(i) for i in range(200)])
        await jobs[-1].aresult(timeout=10)
        await wait_for_async(
            lambda: r.hlen(app.keys.results),
            lambda left: left == 0,
            message="the 200 expired outcomes should be swept (outcomes left)",
            timeout=6,
        )
    assert r.hlen(app.keys.results) == 0 and r.zcard(app.keys.expires) == 0
    await app.aclose()


async def test_idle_worker_blocks_in_redis_instead_of_polling(
    own_redis: RedisServer, namespace: str, own_r: redis.Redis
) -> None:
    r = own_r  # its own server: nothing else moves the command counts
    app = drumbeat.App(own_redis.url, namespace=namespace, idle_block=5.0, maintenance_interval=30)
    started: list[float] = []

    @app.task
    async def ping() -> None:
        started.append(time.monotonic())

    async with running_worker(app):
        # Startup (first claim, heartbeat, first housekeeping pass) ends in the wait.
        await wait_for_async(lambda: blocked_in(r, "bzpopmin"), message="the worker should block")
        before = commands(r, "evalsha") + commands(r, "bzpopmin")
        # Over 2 s in one blocking call: under the 5 s idle block and heartbeat interval.
        await _idle_in(r, "bzpopmin", 2, "the idle worker")
        idle_calls = commands(r, "evalsha") + commands(r, "bzpopmin") - before
        sent = time.monotonic()
        await ping.aenqueue()
        await wait_for_async(lambda: started, message="the enqueued job should start")
    # A poll every 100 ms would have made ~20 calls; a blocked worker makes none.
    assert idle_calls <= 1
    # Woken by the enqueue itself, not by the end of its 5 s block.
    assert started[0] - sent < 1.0
    await app.aclose()


async def test_an_ack_redis_refuses_lets_the_lease_go_and_the_worker_goes_on(
    app: drumbeat.App,
    r: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[int] = []

    @app.task
    async def work(n: int) -> None:
        ran.append(n)

    good_complete = app.scripts.complete

    def broken_complete(items: Any, *args: Any, **kwargs: Any) -> Call[list[int]]:
        # A script error (here: the call names no keys), as a bug in a script would give.
        call = good_complete(items, *args, **kwargs)
        return Call(call.name, [], call.args, call.parse)

    monkeypatch.setattr(app.scripts, "complete", broken_complete)
    first = await work.aenqueue(1)
    async with running_worker(app) as worker:
        # Let go (its lease is no longer renewed), and the worker still runs.
        deadline = time.monotonic() + 10
        held = lambda: [key for keys in worker.table.owned().values() for key in keys]  # noqa: E731
        while not ran or held() or "ack of 1 jobs failed" not in caplog.text:
            assert time.monotonic() < deadline, "the refused ack was not let go"
            await asyncio.sleep(0.01)
        assert r.zscore(app.keys.leases, first.id) is not None, "left for the reaper"
        monkeypatch.setattr(app.scripts, "complete", good_complete)
        second = await work.aenqueue(2)
        assert await second.aresult(timeout=5) is None
    assert ran == [1, 2]


def test_only_jobs_that_can_outrank_a_running_one_are_announced(
    app: drumbeat.App, r: redis.Redis
) -> None:
    """Busy workers hear of ready work only when a checkpoint could lend its slot to it: a job
    of the lowest priority outranks no running job, so enqueueing one publishes nothing (it was
    announced on every enqueue into an empty queue, a message to every worker)."""

    @app.task
    def work() -> None: ...

    with r.pubsub() as sub:
        sub.subscribe(app.keys.signals)
        assert sub.get_message(timeout=5) is not None  # the subscription's confirmation
        work.enqueue()  # priority 0 into an empty queue
        work.options(delay=30).enqueue()  # priority 0, the next one due
        work.options(priority=5).enqueue()
        message = sub.get_message(timeout=5)
    assert message is not None and message["data"] == b"r5", (
        f"the first announcement should be the priority-5 job's (b'r5'), got {message!r}"
    )


async def test_a_task_enqueued_by_name_keeps_its_registered_priority(
    app: drumbeat.App, r: redis.Redis
) -> None:
    @app.task(name="urgent.thing", priority=7)
    def urgent_thing() -> None: ...

    jobs = [app.enqueue("urgent.thing"), await app.aenqueue("urgent.thing")]
    for job in jobs:
        score = r.zscore(app.keys.ready, job.id)
        assert score is not None
        assert MAX_PRIORITY - int(score) // PRIORITY_SPAN == 7, (
            "a task enqueued by name should keep the priority it was registered with"
        )
