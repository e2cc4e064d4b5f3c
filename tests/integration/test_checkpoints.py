"""Checkpoints on a real Redis: a long job lends its slot to strictly more urgent work and
resumes, saves its progress for the next attempt, stops when cancelled or handed back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

import drumbeat
from tests.conftest import reap_call, running_worker
from tests.helpers import wait_for_async


class Slots:
    """Counts runs doing work at once (a paused run waits in its checkpoint, not counted)."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.events: list[str] = []
        self._lock = threading.Lock()

    def enter(self, what: str) -> None:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.events.append(what)

    def leave(self) -> None:
        with self._lock:
            self.active -= 1


@pytest.fixture
async def ckpt(redis_url: str, namespace: str) -> AsyncIterator[drumbeat.App]:
    app = drumbeat.App(
        redis_url, namespace=namespace, progress_interval=0.0, idle_block=0.5, lease=2.0,
        maintenance_interval=0.1, max_stalls=5,
    )  # fmt: skip
    yield app
    await app.aclose()


async def going(worker: drumbeat.Worker, done: list[Any], n: int, message: str) -> None:
    """Waits until the worker listens for signals and the job did ``n`` units of work."""
    await wait_for_async(
        lambda: worker.signals.subscribed.is_set() and len(done) >= n, message=message, timeout=10
    )


def unit_task(app: drumbeat.App, slots: Slots, units: list[tuple[str, int]], **config: Any) -> Any:
    """A long sync task: ``n`` units of ``seconds`` each, one checkpoint after each unit."""

    @app.task(**config)
    def units_of(name: str, n: int, seconds: float) -> str:
        start = drumbeat.current_job().progress or 0
        for i in range(start, n):
            slots.enter(f"{name}:{i}")
            time.sleep(seconds)
            units.append((name, i))
            slots.leave()
            drumbeat.checkpoint(progress=i + 1)
        return name

    return units_of


async def test_a_long_sync_job_lends_its_only_slot_to_an_urgent_job_and_resumes(
    ckpt: drumbeat.App,
) -> None:
    slots, units = Slots(), []
    long = unit_task(ckpt, slots, units, priority=0)

    @ckpt.task(priority=9)
    def urgent() -> float:
        slots.enter("urgent")
        slots.leave()
        return time.monotonic()

    job = await long.aenqueue("long", 60, 0.02)
    async with running_worker(ckpt, concurrency=1) as worker:
        await going(worker, units, 3, "the long job did not start")
        enqueued = time.monotonic()
        u = await urgent.aenqueue()
        started = await u.aresult(timeout=10)
        assert len(units) < 60, "the urgent job waited for the long one to finish"
        assert started - enqueued < 1.0, "the urgent job waited more than a few units"
        assert await job.aresult(timeout=30) == "long"
    assert units == [("long", i) for i in range(60)], "a unit was skipped or run twice"
    assert slots.peak == 1, "more jobs worked at once than the worker has slots"
    assert "urgent" in slots.events[3:-1]


async def test_nested_lending_9_interrupts_5_interrupts_0(ckpt: drumbeat.App) -> None:
    slots, units = Slots(), []
    work = unit_task(ckpt, slots, units)
    finished: list[str] = []

    async with running_worker(ckpt, concurrency=1) as worker:
        low = await work.options(priority=0).aenqueue("p0", 40, 0.02)
        await going(worker, units, 2, "p0 did not start")
        mid = await work.options(priority=5).aenqueue("p5", 40, 0.02)
        await wait_for_async(
            lambda: ("p5", 2) in units, message="p5 did not interrupt p0", timeout=10
        )
        high = await work.options(priority=9).aenqueue("p9", 5, 0.02)
        for job in (high, mid, low):
            finished.append(await job.aresult(timeout=30))
            # Each ends before the one it interrupted goes on: nothing of the lower one ran
            # after the higher one's last unit.
        assert slots.peak == 1
    order = [name for name, _ in units]
    last = {name: max(i for i, n in enumerate(order) if n == name) for name in set(order)}
    first = {name: order.index(name) for name in set(order)}
    assert first["p0"] < first["p5"] < first["p9"], order
    assert last["p9"] < last["p5"] < last["p0"], order
    for name, n in (("p0", 40), ("p5", 40), ("p9", 5)):
        assert [i for m, i in units if m == name] == list(range(n)), f"{name}'s units"


async def test_a_job_never_lends_its_slot_to_equal_or_lower_priority(ckpt: drumbeat.App) -> None:
    slots, units = Slots(), []
    work = unit_task(ckpt, slots, units)
    async with running_worker(ckpt, concurrency=1) as worker:
        first = await work.options(priority=5).aenqueue("first", 30, 0.02)
        await going(worker, units, 2, "the first job did not start")
        same = await work.options(priority=5).aenqueue("same", 2, 0.0)
        lower = await work.options(priority=3).aenqueue("lower", 2, 0.0)
        for job in (first, same, lower):
            await job.aresult(timeout=30)
    order = [name for name, _ in units]
    assert order == ["first"] * 30 + ["same"] * 2 + ["lower"] * 2, order


async def test_an_async_job_lends_its_slot_at_acheckpoint(ckpt: drumbeat.App) -> None:
    done: list[str] = []

    @ckpt.task(priority=0)
    async def crawl(pages: int) -> int:
        start = drumbeat.current_job().progress or 0
        for n in range(start, pages):
            await asyncio.sleep(0.02)
            done.append(f"page{n}")
            await drumbeat.acheckpoint(progress=n + 1)
        return pages

    @ckpt.task(priority=9)
    async def urgent() -> None:
        done.append("urgent")

    async with running_worker(ckpt, concurrency=1) as worker:
        job = await crawl.aenqueue(50)
        await going(worker, done, 2, "crawl did not start")
        await (await urgent.aenqueue()).aresult(timeout=10)
        assert len(done) < 50
        assert await job.aresult(timeout=30) == 50
    assert [d for d in done if d != "urgent"] == [f"page{n}" for n in range(50)]


async def test_time_spent_lending_does_not_count_against_the_timeout(ckpt: drumbeat.App) -> None:
    slots, units = Slots(), []
    long = unit_task(ckpt, slots, units, priority=0, timeout=2.0)

    @ckpt.task(priority=9)
    def urgent() -> None:
        time.sleep(1.5)

    async with running_worker(ckpt, concurrency=1) as worker:
        # 1 s of its own work and 1.5 s lent: over its 2-s timeout only if the lent time
        # counted (1.5 s of its own left too little room on a loaded host).
        job = await long.aenqueue("long", 20, 0.05)
        await going(worker, units, 2, "the long job did not start")
        await (await urgent.aenqueue()).aresult(timeout=10)
        assert await job.aresult(timeout=30) == "long", "lent time was counted as its own"


async def test_progress_saved_at_checkpoints_is_where_the_retry_starts(
    ckpt: drumbeat.App,
) -> None:
    seen: list[tuple[int, Any]] = []
    units: list[int] = []

    @ckpt.task(retries=1, backoff=0.01)
    def flaky(n: int) -> str:
        ctx = drumbeat.current_job()
        seen.append((ctx.attempt, ctx.progress))
        for i in range(ctx.progress or 0, n):
            if ctx.attempt == 1 and i == 5:
                raise RuntimeError("the network went away")
            units.append(i)
            drumbeat.checkpoint(progress=i + 1)
        return "done"

    job = await flaky.aenqueue(10)
    async with running_worker(ckpt):
        assert await job.aresult(timeout=20) == "done"
    assert seen == [(1, None), (2, 5)]
    assert units == list(range(10)), "work before the last save was repeated, or skipped"
    assert await job.aprogress() is None, "progress is dropped once the job is done"


async def test_progress_is_readable_by_the_producer_and_refused_when_unencodable(
    ckpt: drumbeat.App,
) -> None:
    release = threading.Event()
    errors: list[str] = []

    @ckpt.task
    def slow() -> None:
        drumbeat.checkpoint(progress={"page": 3, "of": 10})
        release.wait(10)
        try:
            drumbeat.checkpoint(progress=object())
        except drumbeat.SerializationError as exc:
            errors.append(str(exc))

    job = await slow.aenqueue()
    async with running_worker(ckpt):

        async def saved() -> bool:
            return await job.aprogress() == {"page": 3, "of": 10}

        await wait_for_async(saved, message="the progress was not saved", timeout=10)
        assert job.progress() == {"page": 3, "of": 10}
        release.set()
        await job.aresult(timeout=10)
    assert errors and "progress" in errors[0]


async def test_a_run_whose_lease_was_taken_over_cannot_save_progress(
    ckpt: drumbeat.App, r: redis.Redis
) -> None:
    raised: list[str] = []
    go = threading.Event()

    @ckpt.task
    def long() -> None:
        drumbeat.checkpoint(progress=1)
        go.wait(10)
        try:
            drumbeat.checkpoint(progress=2)
        except drumbeat.LeaseLost as exc:
            raised.append(str(exc))
            raise

    job = await long.aenqueue()
    async with running_worker(ckpt, concurrency=1) as worker:

        async def saved() -> bool:
            return await job.aprogress() == 1

        await wait_for_async(saved, message="the first progress was not saved", timeout=10)
        # Its lease is taken over (expired and reaped), and another worker claims it.
        r.zadd(ckpt.keys.leases, {job.id: 0})
        assert reap_call(ckpt).run(r).requeued == 1
        other = ckpt.scripts.claim("other-worker", 1, 60_000, 10).run(r).jobs
        assert [j.id for j in other] == [job.id]
        await wait_for_async(
            lambda: not worker.table.owned(), message="the lost lease went unnoticed", timeout=10
        )
        go.set()
        await wait_for_async(
            lambda: raised, message="the stale run was not told at its checkpoint", timeout=10
        )
    assert job.progress() == 1, "a stale run overwrote the progress"
    assert other[0].token > 0
    stale = ckpt.scripts.save_progress(job.id, 1, b"3").run(r)
    assert stale == 0


async def test_cancel_a_queued_and_a_delayed_job(ckpt: drumbeat.App) -> None:
    @ckpt.task
    def never() -> None:
        raise AssertionError("a cancelled job ran")

    @ckpt.task
    def fine() -> str:
        return "ok"

    queued = await never.aenqueue()
    delayed = await never.options(delay=60).aenqueue()
    assert await queued.acancel() is True
    assert delayed.cancel() is True
    for job in (queued, delayed):
        assert await job.astatus() is drumbeat.JobStatus.CANCELLED
        with pytest.raises(drumbeat.JobCancelled):
            await job.aresult(timeout=1)
        assert await job.acancel() is False, "nothing left to cancel"
    async with running_worker(ckpt):
        done = await (await fine.aenqueue()).aresult(timeout=10)
    assert done == "ok"


async def test_cancel_a_running_sync_job_stops_it_at_its_next_checkpoint(
    ckpt: drumbeat.App,
) -> None:
    slots, units = Slots(), []
    long = unit_task(ckpt, slots, units, retries=3)
    job = await long.aenqueue("long", 500, 0.01)
    async with running_worker(ckpt) as worker:
        await going(worker, units, 3, "the job did not start")
        assert await job.acancel() is True
        with pytest.raises(drumbeat.JobCancelled):
            await job.aresult(timeout=10)
        stopped_at = len(units)
        await asyncio.sleep(0.3)  # the worker keeps running; the job must not come back
        assert len(units) == stopped_at, "the cancelled job was retried"
    assert stopped_at < 500
    assert await job.astatus() is drumbeat.JobStatus.CANCELLED


async def test_cancel_a_running_async_job_stops_it_at_once(ckpt: drumbeat.App) -> None:
    cancelled = asyncio.Event()

    @ckpt.task(retries=3)
    async def sleeper() -> None:
        try:
            await asyncio.sleep(60)  # no checkpoint: an async task is cancelled where it waits
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job = await sleeper.aenqueue()
    async with running_worker(ckpt) as worker:
        await wait_for_async(
            lambda: worker.signals.subscribed.is_set() and worker.table.running,
            message="the job did not start",
            timeout=10,
        )
        assert await job.acancel() is True
        with pytest.raises(drumbeat.JobCancelled):
            await job.aresult(timeout=10)
    assert cancelled.is_set()


async def test_a_stop_hands_a_checkpointing_job_back_at_once_with_its_progress(
    redis_url: str, namespace: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, shutdown_grace=30.0, idle_block=0.5)
    slots, units = Slots(), []
    long = unit_task(app, slots, units)
    job = await long.aenqueue("long", 400, 0.01)
    worker = drumbeat.Worker(app)
    run = asyncio.create_task(worker.run())
    await wait_for_async(lambda: len(units) >= 5, message="the job did not start", timeout=10)
    stopping = time.monotonic()
    worker.stop()
    await asyncio.wait_for(run, 10)
    assert time.monotonic() - stopping < 5, "the worker waited out shutdown_grace"
    assert await job.astatus() is drumbeat.JobStatus.QUEUED, "it was not handed back"
    saved = await job.aprogress()
    assert saved == len(units), "the progress at the hand-back was not saved"
    async with running_worker(app):
        assert await job.aresult(timeout=30) == "long"
    assert [i for _, i in units] == list(range(400)), "a unit was repeated or skipped"
    await app.aclose()


async def test_status_and_dead_letters_show_the_saved_progress(ckpt: drumbeat.App) -> None:
    from drumbeat import admin

    release = threading.Event()

    @ckpt.task
    def halfway() -> None:
        drumbeat.checkpoint(progress={"built": 120, "of": 200})
        release.wait(10)
        raise RuntimeError("the disk is full")

    job = await halfway.aenqueue()
    async with running_worker(ckpt):

        async def shown() -> bool:
            stats = await asyncio.to_thread(admin.queue_stats, ckpt)
            return [r.progress for r in stats.running] == [{"built": 120, "of": 200}]

        await wait_for_async(
            shown, message="status did not show the running job's progress", timeout=10
        )
        release.set()
        with pytest.raises(drumbeat.JobFailed):
            await job.aresult(timeout=10)
    [letter] = admin.dead_letters(ckpt)
    assert letter.progress == {"built": 120, "of": 200}, "a dead letter keeps its progress"


async def test_a_cancel_whose_signal_was_missed_reaches_the_worker_by_its_heartbeat(
    ckpt: drumbeat.App, r: redis.Redis
) -> None:
    slots, units = Slots(), []
    long = unit_task(ckpt, slots, units)
    job = await long.aenqueue("long", 1000, 0.01)
    async with running_worker(ckpt):
        await wait_for_async(lambda: len(units) >= 3, message="the job did not start", timeout=10)
        # What cancel.lua writes, without its signal (as if the worker's subscription had
        # dropped at that moment): the heartbeat (every lease/3) reads it.
        r.hset(ckpt.keys.cancels, job.id, 1)
        with pytest.raises(drumbeat.JobCancelled):
            await job.aresult(timeout=10)
    assert len(units) < 1000
    assert not r.hexists(ckpt.keys.cancels, job.id), "the request is dropped once settled"


async def test_a_cancelled_job_whose_worker_died_is_not_requeued(
    ckpt: drumbeat.App, r: redis.Redis
) -> None:
    @ckpt.task
    def work() -> None:
        pass

    job = await work.aenqueue()
    [claimed] = ckpt.scripts.claim("a-worker-that-dies", 1, 60_000, 10).run(r).jobs
    assert claimed.id == job.id
    assert await job.acancel() is True  # running: a request, its worker is gone
    r.zadd(ckpt.keys.leases, {job.id: 0})  # its lease runs out
    reaped = reap_call(ckpt).run(r)
    assert reaped.requeued == 0 and reaped.buried == [job.id]
    assert await job.astatus() is drumbeat.JobStatus.CANCELLED
    assert not r.zscore(ckpt.keys.ready, job.id), "a cancelled job was requeued"


async def test_a_delayed_urgent_job_gets_a_lent_slot_when_it_comes_due(ckpt: drumbeat.App) -> None:
    """Every slot busy, nobody claims, so nobody would promote the urgent job when its delay
    ends: a busy worker whose jobs checkpoint promotes what comes due, and lends for it."""
    slots, units = Slots(), []
    long = unit_task(ckpt, slots, units, priority=0)

    @ckpt.task(priority=9)
    def urgent() -> int:
        return len(units)

    job = await long.aenqueue("long", 150, 0.02)  # about 3 s
    async with running_worker(ckpt, concurrency=1) as worker:
        await going(worker, units, 3, "the long job did not start")
        late = await urgent.options(delay=0.5).aenqueue()
        ran_at_unit = await late.aresult(timeout=10)
        assert ran_at_unit < 100, f"it waited for the long job: started at unit {ran_at_unit}"
        assert await job.aresult(timeout=30) == "long"
    assert slots.peak == 1


async def test_an_urgent_job_retrying_after_a_backoff_gets_a_lent_slot_again(
    ckpt: drumbeat.App,
) -> None:
    slots, units = Slots(), []
    long = unit_task(ckpt, slots, units, priority=0)
    starts: list[int] = []

    @ckpt.task(priority=9, retries=1)
    def urgent() -> int:
        starts.append(len(units))
        if len(starts) == 1:
            raise drumbeat.Retry(delay=0.3)
        return len(units)

    job = await long.aenqueue("long", 150, 0.02)  # about 3 s
    async with running_worker(ckpt, concurrency=1) as worker:
        await going(worker, units, 3, "the long job did not start")
        u = await urgent.aenqueue()
        second = await u.aresult(timeout=10)
        assert second < 100, f"the retry waited for the long job: started at unit {second}"
        assert await job.aresult(timeout=30) == "long"
    assert len(starts) == 2 and slots.peak == 1
