"""A worker rides out Redis errors other than a lost connection (issue 10, defect 2.5): a full
server (OOM under noeviction), a demoted primary (READONLY), a long script (BUSY), a restart
that loads a large AOF (LOADING), lost scripts (NOSCRIPT inside pipelines) and killed
connections. Each test fails its own redis-server while jobs flow, then checks that the worker
logged the error, kept running, and that every job still completed; the shutdown tests check
that a failing hand-back stops neither the heartbeat's end nor the deregistration.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from functools import partial
from typing import Any

import pytest
import redis

import drumbeat
from drumbeat.scripts import Call
from drumbeat.task import Task
from tests.conftest import RedisServer, running_worker

from .conftest import open_app, until, warnings_about

pytestmark = pytest.mark.chaos

# The most log lines one kind of failure may write in one fault: a worker that retried without
# backing off would write hundreds in the seconds a fault lasts.
_FEW = 40


def _work_task(
    app: drumbeat.App, gate: asyncio.Event | None = None
) -> tuple[Task[..., int], Counter[int]]:
    """A task that counts its runs and returns twice its argument, after ``gate`` if given."""
    runs: Counter[int] = Counter()

    @app.task(name="chaos.work")
    async def work(n: int, pause: float = 0.0) -> int:
        runs[n] += 1
        if gate is not None:
            await gate.wait()
        if pause:
            await asyncio.sleep(pause)
        return n * 2

    return work, runs


async def _all_done(jobs: list[drumbeat.Job[int]], numbers: list[int]) -> None:
    for job, n in zip(jobs, numbers, strict=True):
        assert await job.aresult(timeout=30) == n * 2, f"job {job.id} (n={n}) gave a wrong result"


def _no_spin(caplog: pytest.LogCaptureFixture, word: str) -> None:
    lines = warnings_about(caplog, word)
    assert len(lines) <= _FEW, (
        f"{len(lines)} warnings about {word!r}: the worker retried without backing off; "
        f"first ones: {lines[:5]}"
    )


# -- OOM ---------------------------------------------------------------------------------------


async def test_rides_out_oom_under_noeviction(
    chaos_app: drumbeat.App, admin: redis.Redis, worker_log: pytest.LogCaptureFixture
) -> None:
    gate = asyncio.Event()
    work, runs = _work_task(chaos_app, gate)
    async with running_worker(chaos_app, concurrency=4) as worker:
        running = await chaos_app.aenqueue_many([work.prepare(i) for i in range(3)])
        await until(lambda: worker.table.running == 3, "the first 3 jobs to start")
        # Delayed jobs come due while Redis is full: the claim that promotes them writes first
        # with a command Redis refuses under OOM.
        delayed = await chaos_app.aenqueue_many(
            [work.options(delay=0.3).prepare(i) for i in range(3, 10)]
        )
        admin.config_set("maxmemory", 1)
        # (Redis 7 replies OutOfMemoryError; 6.2 wraps the OOM in a script error.)
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            await work.aenqueue(99)
        await until(lambda: bool(warnings_about(worker_log, "claiming failed")),
                    "the claim loop to report the OOM")  # fmt: skip
        await until(lambda: bool(warnings_about(worker_log, "lease renewal failed")),
                    "the heartbeat to report the OOM")  # fmt: skip
        gate.set()  # the running jobs end, and are settled while Redis is full
        await until(lambda: worker.table.running == 0, "the running jobs to end")
        assert "maxmemory" in " ".join(warnings_about(worker_log, "failed")), worker_log.text
        assert not warnings_about(worker_log, "crashed"), worker_log.text
        admin.config_set("maxmemory", 0)
        await _all_done(running + delayed, list(range(10)))
    assert set(runs) == set(range(10))
    _no_spin(worker_log, "maxmemory")


# -- READONLY ----------------------------------------------------------------------------------


def _reported(caplog: pytest.LogCaptureFixture, part: str, word: str) -> bool:
    return any(line.startswith(part) for line in warnings_about(caplog, word))


def _replica_in_sync(client: redis.Redis) -> bool:
    info = client.info("replication")
    return bool(info.get("master_link_status") == "up" and not info.get("master_sync_in_progress"))


async def test_rides_out_readonly_after_a_failover(
    own_server: RedisServer,
    make_server: Any,
    chaos_app: drumbeat.App,
    admin: redis.Redis,
    worker_log: pytest.LogCaptureFixture,
) -> None:
    gate = asyncio.Event()
    work, runs = _work_task(chaos_app, gate)
    other = make_server()
    standby = redis.Redis.from_url(other.url)
    try:
        async with running_worker(chaos_app, concurrency=4) as worker:
            # Two slots stay free: the worker waits for work in Redis (a blocked BZPOPMIN)
            # when its server is demoted.
            jobs = await chaos_app.aenqueue_many([work.prepare(i) for i in range(2)])
            await until(lambda: worker.table.running == 2, "2 jobs to start")
            # A failover: the standby takes a copy and is promoted, and the worker's server
            # becomes its replica (read-only, with the same data) under the running worker.
            standby.replicaof("127.0.0.1", own_server.port)
            await until(lambda: _replica_in_sync(standby), "the standby to sync")
            standby.replicaof("NO", "ONE")
            admin.replicaof("127.0.0.1", other.port)
            await until(lambda: _replica_in_sync(admin), "the demoted server to sync")
            with pytest.raises(redis.ResponseError, match="read only replica"):
                await work.aenqueue(99)
            gate.set()  # acks now meet a read-only server
            for part in ("claiming", "settling", "lease renewal"):
                await until(partial(_reported, worker_log, part, "read only replica"),
                            f"{part} to report READONLY")  # fmt: skip
            admin.replicaof("NO", "ONE")
            await _all_done(jobs, [0, 1])
            assert set(runs) == {0, 1}
            assert not warnings_about(worker_log, "plain waits"), worker_log.text
            # And it claims again.
            more = await chaos_app.aenqueue_many([work.prepare(i) for i in range(10, 15)])
            await _all_done(more, list(range(10, 15)))
    finally:
        standby.close()
    _no_spin(worker_log, "read only replica")


# -- BUSY --------------------------------------------------------------------------------------

_BUSY_LUA = """
local function ms() local t = redis.call('TIME') return t[1] * 1000 + t[2] / 1000 end
local stop = ms() + tonumber(ARGV[1])
while ms() < stop do end
return 1
"""


async def test_rides_out_busy_script(
    make_server: Any, worker_log: pytest.LogCaptureFixture
) -> None:
    server = make_server("--lua-time-limit", "100")
    gate = asyncio.Event()
    blocker = redis.Redis.from_url(server.url, socket_timeout=30)
    probe = redis.Redis.from_url(server.url, socket_timeout=30)
    try:
        async with open_app(server) as app:
            work, runs = _work_task(app, gate)
            async with running_worker(app, concurrency=4) as worker:
                jobs = await app.aenqueue_many([work.prepare(i) for i in range(30)])
                await until(lambda: worker.table.running == 4, "4 jobs to start")
                busy = asyncio.create_task(asyncio.to_thread(blocker.eval, _BUSY_LUA, 0, 2000))
                await until(lambda: _is_busy(probe), "the script to make Redis busy")
                gate.set()  # acks and claims now meet BUSY
                await until(lambda: bool(warnings_about(worker_log, "BUSY")),
                            "the worker to report BUSY")  # fmt: skip
                assert await busy == 1
                await _all_done(jobs, list(range(30)))
        assert set(runs) == set(range(30))
    finally:
        blocker.close()
        probe.close()
    _no_spin(worker_log, "BUSY")


def _is_busy(client: redis.Redis) -> bool:
    try:
        client.ping()
    except redis.ResponseError as exc:
        return str(exc).startswith("BUSY")
    return False


# -- LOADING -----------------------------------------------------------------------------------


async def test_rides_out_a_restart_that_loads_a_large_aof(
    make_server: Any, worker_log: pytest.LogCaptureFixture
) -> None:
    server: RedisServer = make_server("--appendonly", "yes")
    admin = redis.Redis.from_url(server.url, socket_timeout=30)
    gate = asyncio.Event()
    # Redis 7 can answer clients while loading every 1 KB loaded (6.2: every 2 MB, fixed).
    answer_while_loading = []
    if int(server.version().split(".")[0]) >= 7:
        answer_while_loading = ["--loading-process-events-interval-bytes", "1024"]
    try:
        async with open_app(server) as app:
            work, runs = _work_task(app, gate)
            async with running_worker(app, concurrency=4) as worker:
                jobs = await app.aenqueue_many([work.prepare(i) for i in range(20)])
                await until(lambda: worker.table.running == 4, "4 jobs to start")
                # Enough keys that loading them, slowed by key-load-delay, takes seconds; and
                # enough bytes (incompressible) that Redis 6.2, which answers clients every 2 MB
                # loaded, answers LOADING a few times meanwhile.
                with admin.pipeline(transaction=False) as pipe:
                    for i in range(0, 20_000, 1000):
                        pipe.mset({f"filler:{j}": os.urandom(1000) for j in range(i, i + 1000)})
                    pipe.execute()
                admin.bgrewriteaof()  # the jobs and fillers in the AOF's base (RDB format)
                await until(lambda: _rewritten(admin), "the AOF rewrite to end")
                server.halt()
                gate.set()  # acks now meet a refused connection, then LOADING
                await until(lambda: bool(warnings_about(worker_log, "Connection")),
                            "the worker to report the refused connection")  # fmt: skip
                server.spawn("--key-load-delay", "100", *answer_while_loading)
                await until(lambda: bool(warnings_about(worker_log, "loading")),
                            "the worker to report LOADING")  # fmt: skip
                await asyncio.to_thread(server.wait_ready)
                await app.aclose()  # the test's own connections died with the server
                await _all_done(jobs, list(range(20)))
        assert set(runs) == set(range(20))
    finally:
        admin.close()
    _no_spin(worker_log, "loading")


def _rewritten(client: redis.Redis) -> bool:
    info = client.info("persistence")
    return not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]


# -- NOSCRIPT ----------------------------------------------------------------------------------


async def test_every_job_runs_while_scripts_are_flushed(
    own_server: RedisServer, admin: redis.Redis, worker_log: pytest.LogCaptureFixture
) -> None:
    # A small batch_limit: enqueue_many pipelines its calls, and acks go out several at once.
    async with open_app(own_server, batch_limit=20) as app:
        work, runs = _work_task(app)
        admin.script_flush()
        jobs = await app.aenqueue_many([work.prepare(i, 0.005) for i in range(300)])
        stop = threading.Event()
        flushes = 0

        def flush() -> None:
            nonlocal flushes
            while not stop.wait(0.01):
                admin.script_flush()
                flushes += 1

        flusher = threading.Thread(target=flush)
        flusher.start()
        try:
            async with running_worker(app, concurrency=8):
                await until(lambda: len(runs) == 300, "all 300 jobs to run", timeout=30)
        finally:
            stop.set()
            flusher.join()
        await _all_done(jobs, list(range(300)))
    assert flushes > 0
    assert not warnings_about(worker_log, ""), worker_log.text


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
async def test_enqueue_many_survives_scripts_flushed_inside_its_pipeline(
    own_server: RedisServer, admin: redis.Redis, monkeypatch: pytest.MonkeyPatch, use_async: bool
) -> None:
    """The first call loads the script; if Redis forgets it before the pipelined rest runs, each
    of those is refused with NOSCRIPT (and did nothing): they run again, and every job is added
    exactly once. Before, the pipeline raised NoScriptError after adding the first batch."""
    async with open_app(own_server, batch_limit=20) as app:
        work, _ = _work_task(app)
        run, arun = Call.run, Call.arun

        def run_then_flush(call: Call[Any], client: Any) -> Any:
            result = run(call, client)
            admin.script_flush()
            return result

        async def arun_then_flush(call: Call[Any], client: Any) -> Any:
            result = await arun(call, client)
            admin.script_flush()
            return result

        monkeypatch.setattr(Call, "run", run_then_flush)
        monkeypatch.setattr(Call, "arun", arun_then_flush)
        items = [work.prepare(i, 0.0) for i in range(100)]
        jobs = await app.aenqueue_many(items) if use_async else app.enqueue_many(items)
        monkeypatch.undo()
        assert len({job.id for job in jobs}) == 100
        assert admin.zcard(app.keys.ready) == 100, "a batch was lost or added twice"


# -- killed connections ------------------------------------------------------------------------


async def test_no_job_lost_while_connections_are_killed(
    chaos_app: drumbeat.App, admin: redis.Redis, worker_log: pytest.LogCaptureFixture
) -> None:
    work, runs = _work_task(chaos_app)
    n = 200
    jobs = await chaos_app.aenqueue_many([work.prepare(i, 0.01) for i in range(n)])
    stop = threading.Event()
    kills = 0

    def kill() -> None:
        nonlocal kills
        while not stop.wait(0.05):
            kills += int(admin.client_kill_filter(_type="normal", skipme=True))

    killer = threading.Thread(target=kill)
    killer.start()
    try:
        async with running_worker(chaos_app, concurrency=4):
            await until(lambda: len(runs) == n, f"all {n} jobs to run", timeout=30)
            stop.set()
            killer.join()
            await chaos_app.aclose()  # the test's own connections were killed too
            await _all_done(jobs, list(range(n)))
    finally:
        stop.set()
        killer.join()
    assert kills > 0
    assert admin.zcard(chaos_app.keys.dead) == 0
    assert warnings_about(worker_log, "Connection"), worker_log.text


# -- shutdown with a failing hand-back -----------------------------------------------------------


async def test_shutdown_deregisters_when_the_handback_fails(
    chaos_app: drumbeat.App, admin: redis.Redis, worker_log: pytest.LogCaptureFixture
) -> None:
    gate = asyncio.Event()
    work, runs = _work_task(chaos_app, gate)
    jobs = await chaos_app.aenqueue_many([work.prepare(i) for i in range(2)])
    worker = drumbeat.Worker(chaos_app, concurrency=2)
    task = asyncio.create_task(worker.run())
    await until(lambda: worker.table.running == 2, "both jobs to start")
    assert admin.zscore(chaos_app.keys.workers, worker.id) is not None
    admin.config_set("maxmemory", 1)  # the hand-back writes first with a refused command
    worker.stop()
    await asyncio.wait_for(task, 30)
    assert warnings_about(worker_log, "handing back unfinished jobs failed"), worker_log.text
    assert not worker.heartbeat.alive, "the heartbeat thread outlived the worker"
    assert admin.zscore(chaos_app.keys.workers, worker.id) is None, "the worker is registered"
    assert not admin.hexists(chaos_app.keys.workerinfo, worker.id)
    # Not handed back, not lost: their leases lapse and another worker runs them.
    admin.config_set("maxmemory", 0)
    gate.set()
    async with running_worker(chaos_app, concurrency=2):
        await _all_done(jobs, [0, 1])
    assert runs == Counter({0: 2, 1: 2})


async def test_shutdown_ends_when_redis_is_gone(
    own_server: RedisServer, chaos_app: drumbeat.App, worker_log: pytest.LogCaptureFixture
) -> None:
    gate = asyncio.Event()
    work, _ = _work_task(chaos_app, gate)
    await chaos_app.aenqueue_many([work.prepare(i) for i in range(2)])
    worker = drumbeat.Worker(chaos_app, concurrency=2)
    task = asyncio.create_task(worker.run())
    await until(lambda: worker.table.running == 2, "both jobs to start")
    own_server.halt()
    worker.stop()
    started = time.monotonic()
    await asyncio.wait_for(task, 30)
    took = time.monotonic() - started
    assert not worker.heartbeat.alive, "the heartbeat thread outlived the worker"
    for step in ("handing back unfinished jobs failed", "deregistering failed"):
        assert warnings_about(worker_log, step), worker_log.text
    print(f"shutdown without Redis took {took:.1f} s")


async def test_a_redis_down_for_seconds_does_not_stop_the_worker(
    own_server: RedisServer, worker_log: pytest.LogCaptureFixture
) -> None:
    """Every part waits out a Redis that is gone for longer than the crash budget (five
    restarts in 60 s, with backoff, take about 1.5 s): the signals listener too, which a lost
    pub/sub connection used to crash."""
    async with open_app(own_server) as app:
        work, runs = _work_task(app)
        worker = drumbeat.Worker(app)
        running = asyncio.create_task(worker.run())
        await until(worker.signals.subscribed.is_set, "the worker to subscribe")
        own_server.halt()
        await asyncio.sleep(4.0)  # the outage itself: nothing to poll for while Redis is gone
        assert not running.done(), f"the worker stopped while Redis was down: {running}"
        own_server.spawn()
        await asyncio.to_thread(own_server.wait_ready)
        await app.aclose()  # the test's own connections died with the server
        job = await work.aenqueue(7)
        assert await job.aresult(timeout=20) == 14
        await until(worker.signals.subscribed.is_set, "the worker to subscribe again")
        worker.stop()
        await asyncio.wait_for(running, 20)
    assert 7 in runs
    assert not [r for r in worker_log.records if r.levelname == "CRITICAL"], worker_log.text


async def test_a_checkpoint_while_redis_is_gone_does_not_fail_the_job(
    make_server: Any, worker_log: pytest.LogCaptureFixture
) -> None:
    server: RedisServer = make_server("--appendonly", "yes", "--appendfsync", "always")
    units: list[int] = []
    async with open_app(server, progress_interval=0.0, lease=30.0) as app:

        @app.task(name="chaos.units")
        def long(n: int) -> int:
            for i in range(drumbeat.current_job().progress or 0, n):
                time.sleep(0.02)
                units.append(i)
                drumbeat.checkpoint(progress=i + 1)
            return n

        job = await long.aenqueue(100)
        async with running_worker(app, concurrency=1):
            await until(lambda: len(units) >= 10, "the job to get going")
            server.halt()
            at_halt = len(units)
            await until(lambda: len(units) >= at_halt + 3, "the job to go on without Redis")
            server.spawn()
            await asyncio.to_thread(server.wait_ready)
            await app.aclose()  # the test's own connections died with the server
            assert await job.aresult(timeout=30) == 100
    assert units == list(range(100)), "a unit was repeated or skipped"
    assert warnings_about(worker_log, "checkpoint of job"), "the skipped checkpoint was not logged"
