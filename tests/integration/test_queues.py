"""Queues: routing (a worker claims only from the queues it serves), order across queues
(priority, then enqueue order), lending within served queues, reaping into the job's queue,
`status` per queue, and the rolling-deploy hand-back of jobs whose task a worker lacks."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import redis

import drumbeat
from drumbeat import admin
from drumbeat.cli.shapes import schedule_json
from drumbeat.errors import ConfigurationError, InvalidJob
from drumbeat.job import decode_spec
from drumbeat.protocol import FIELD_SEP, JOB_STATE_FIELDS, SHORT_JOB_STATE_FIELDS
from drumbeat.replies import Claimed
from drumbeat.script_sources import SHAS
from drumbeat.task import Options, Prepared
from drumbeat.testing import arun_until_idle
from tests.conftest import RedisServer, reap_call, running_worker
from tests.helpers import commands, redis_now_ms, set_due, wait_for_async
from tests.integration.test_cli import APP, _forget_app_module, assert_clean_error, ok, row, run


@pytest.fixture
async def qapp(redis_url: str, namespace: str) -> AsyncIterator[drumbeat.App]:
    app = drumbeat.App(redis_url, namespace=namespace, idle_block=0.5, maintenance_interval=0.2)
    yield app
    await app.aclose()


def _state(r: redis.Redis, app: drumbeat.App, job_id: str) -> dict[str, str]:
    raw = r.hget(app.keys.state, job_id)
    assert raw is not None, f"job {job_id} has no state"
    parts = raw.decode().split(FIELD_SEP, len(JOB_STATE_FIELDS) - 1)
    if len(parts) < len(JOB_STATE_FIELDS):  # the short layout: default queue, never unknown
        return {"unknown": "0", "queue": ""} | dict(zip(SHORT_JOB_STATE_FIELDS, parts, strict=True))
    return dict(zip(JOB_STATE_FIELDS, parts, strict=True))


# -- the API ---------------------------------------------------------------------------------


def test_queue_names_are_checked_where_they_are_given(qapp: drumbeat.App) -> None:
    @qapp.task
    def plain() -> None: ...

    assert plain.config.queue == "default"
    with pytest.raises(InvalidJob, match="queue name 'has space'"):
        qapp.task(queue="has space")(lambda: None)
    with pytest.raises(InvalidJob, match="queue name must be a non-empty string"):
        plain.options(queue="")
    with pytest.raises(InvalidJob, match=r"queue name '\{x\}'"):
        plain.options(queue="{x}")
    with pytest.raises(ConfigurationError, match="queue name 'a b'"):
        drumbeat.Worker(qapp, queues=["a b"])
    with pytest.raises(ConfigurationError, match="non-empty list of queue names"):
        drumbeat.Worker(qapp, queues=[])


def test_jobs_go_to_their_tasks_queue_or_the_one_a_call_names(
    qapp: drumbeat.App, r: redis.Redis
) -> None:
    @qapp.task(queue="builds")
    def build() -> None: ...

    @qapp.task
    def mail() -> None: ...

    k = qapp.keys
    jobs = qapp.enqueue_many([build.prepare(), mail.prepare(), mail.options(queue="builds")
                              .prepare(), build.options(queue="default").prepare()])  # fmt: skip
    assert [r.zscore(k.ready_of("builds"), j.id) is not None for j in jobs] == [1, 0, 1, 0]
    assert [r.zscore(k.ready, j.id) is not None for j in jobs] == [0, 1, 0, 1]
    delayed = build.options(delay=60).enqueue()
    assert r.zscore(k.due_of("builds"), delayed.id) is not None
    assert set(r.smembers(k.queues)) == {b"builds"}  # a list on redis-py 5
    assert [j.status() for j in (*jobs, delayed)] == ["queued"] * 4 + ["scheduled"]
    assert qapp.queues() == ["default", "builds"]
    # Cancel finds a waiting job in its queue, delayed or not.
    assert delayed.cancel() and jobs[0].cancel()
    assert r.zscore(k.due_of("builds"), delayed.id) is None
    assert r.zscore(k.ready_of("builds"), jobs[0].id) is None
    assert [delayed.status(), jobs[0].status()] == ["cancelled", "cancelled"]


# -- routing and order -----------------------------------------------------------------------


async def test_a_worker_claims_only_from_the_queues_it_serves(qapp: drumbeat.App) -> None:
    ran: dict[str, list[str]] = {"builds": [], "default": []}

    @qapp.task(queue="builds")
    async def build(n: int) -> str:
        return drumbeat.current_job().worker

    @qapp.task
    async def mail(n: int) -> str:
        return drumbeat.current_job().worker

    # Only a builds worker: the default job enqueued first stays queued while builds run.
    waiting = await mail.aenqueue(0)
    async with running_worker(qapp, queues=["builds"]) as builds_worker:
        first = [await build.aenqueue(i) for i in range(5)]
        for job in first:
            ran["builds"].append(await job.aresult(timeout=10))
        assert await waiting.astatus() == "queued", "a builds worker took a default job"
        async with running_worker(qapp, queues=["default"]) as default_worker:
            more = [await build.aenqueue(i) for i in range(20)]
            mails = [await mail.aenqueue(i) for i in range(20)]
            for job in more:
                ran["builds"].append(await job.aresult(timeout=10))
            for job in [waiting, *mails]:
                ran["default"].append(await job.aresult(timeout=10))
    assert set(ran["builds"]) == {builds_worker.id}, "a default worker took a builds job"
    assert set(ran["default"]) == {default_worker.id}, "a builds worker took a default job"


def _place(app: drumbeat.App, placed: list[tuple[str, str, int]]) -> None:
    """Enqueues a job of task ``t.<name>`` per (name, queue, priority), in that order."""
    for name, queue, priority in placed:
        options = Options(priority=priority, queue=queue)
        app.enqueue_many([Prepared(f"t.{name}", (), {}, options)])


def _names(jobs: list[Claimed]) -> list[str]:
    return [decode_spec(j.spec).task[2:] if j.spec else "?" for j in jobs]


PLACED = [("a", "default", 0), ("b", "builds", 0), ("c", "default", 5), ("d", "builds", 5),
          ("e", "builds", 0), ("f", "default", 0), ("g", "other", 9)]  # fmt: skip


def test_one_claim_takes_the_best_priority_across_queues_then_enqueue_order(
    qapp: drumbeat.App, r: redis.Redis
) -> None:
    _place(qapp, PLACED)
    claim = qapp.scripts.claim("w", 10, 60_000, 100, queues=["default", "builds"])
    taken = claim.run(r).jobs
    assert _names(taken) == ["c", "d", "a", "b", "e", "f"], "priority, then enqueue order"
    assert [j.queue for j in taken] == ["default", "builds", "default", "builds", "builds",
                                        "default"]  # fmt: skip


def test_claims_of_one_job_take_the_same_order(qapp: drumbeat.App, r: redis.Redis) -> None:
    _place(qapp, PLACED)
    one_by_one: list[Claimed] = []
    for _ in range(7):
        claim = qapp.scripts.claim("w", 1, 60_000, 100, queues=["default", "builds"])
        one_by_one += claim.run(r).jobs
    assert _names(one_by_one) == ["c", "d", "a", "b", "e", "f"], "`other` is not served"
    [other] = qapp.scripts.claim("w", 5, 60_000, 100, queues=["other"]).run(r).jobs
    assert (_names([other]), other.queue) == (["g"], "other")


async def test_a_worker_on_two_queues_runs_priority_then_enqueue_order(
    qapp: drumbeat.App,
) -> None:
    order: list[str] = []

    @qapp.task(queue="builds")
    async def build(name: str) -> None:
        order.append(name)

    @qapp.task
    async def mail(name: str) -> None:
        order.append(name)

    jobs = [await mail.aenqueue("a"), await build.aenqueue("b"),
            await mail.options(priority=5).aenqueue("c"),
            await build.options(priority=5).aenqueue("d"), await build.aenqueue("e"),
            await mail.aenqueue("f")]  # fmt: skip
    async with running_worker(qapp, concurrency=1) as worker:
        assert worker.queues == ["default", "builds"]
        for job in jobs:
            await job.aresult(timeout=10)
    assert order == ["c", "d", "a", "b", "e", "f"]


async def test_an_idle_worker_wakes_for_any_queue_it_serves(qapp: drumbeat.App) -> None:
    @qapp.task(queue="builds")
    async def build() -> None: ...

    @qapp.task(queue="docs")
    async def doc() -> None: ...

    # idle_block is long: only a wake marker of the queue can start the job in time.
    qapp.settings = qapp.settings.replace(idle_block=30.0)
    async with running_worker(qapp, queues=["docs", "builds"]) as worker:
        await wait_for_async(lambda: worker.claimer._waiter is not None,
                             message="the worker never waited")  # fmt: skip
        for task in (build, doc, build):
            await asyncio.sleep(0.2)  # let it go idle again
            await (await task.aenqueue()).aresult(timeout=5)


# -- lending, reaping, status ------------------------------------------------------------------


def test_lending_looks_only_at_served_queues(qapp: drumbeat.App, r: redis.Redis) -> None:
    _place(qapp, [("urgent", "builds", 9)])
    lent = qapp.scripts.claim_urgent("w", 1, 60_000, queues=["default"]).run(r)
    assert (lent.jobs, lent.best) == ([], -1), "lent to a job of a queue the worker does not serve"
    lent = qapp.scripts.claim_urgent("w", 1, 60_000, queues=["default", "builds"]).run(r)
    assert [(j.priority, j.queue) for j in lent.jobs] == [(9, "builds")]


async def test_a_checkpoint_lends_its_slot_only_to_a_served_queue(qapp: drumbeat.App) -> None:
    import threading

    go = threading.Event()
    ran: list[str] = []

    @qapp.task
    def long() -> None:
        while not go.is_set():
            drumbeat.checkpoint()
            go.wait(0.01)

    @qapp.task(queue="builds", priority=9)
    def urgent_build() -> None:
        ran.append("build")

    @qapp.task(priority=9)
    def urgent_mail() -> None:
        ran.append("mail")

    job = await long.aenqueue()
    async with running_worker(qapp, concurrency=1, queues=["default"]) as worker:
        await wait_for_async(lambda: worker.signals.subscribed.is_set() and worker.table.running,
                             message="the long job did not start")  # fmt: skip
        build = await urgent_build.aenqueue()
        mail = await urgent_mail.aenqueue()
        await mail.aresult(timeout=10)  # lent: the long job still runs
        assert not go.is_set() and await job.astatus() == "running"
        assert await build.astatus() == "queued", "lent to a queue the worker does not serve"
        go.set()
        await job.aresult(timeout=10)
    assert ran == ["mail"]


def test_reap_requeues_an_expired_lease_into_its_own_queue(
    qapp: drumbeat.App, r: redis.Redis
) -> None:
    _place(qapp, [("x", "b", 0)])
    [job] = qapp.scripts.claim("dead", 1, 60_000, 10, queues=["b"]).run(r).jobs
    r.zadd(qapp.keys.leases, {job.id: 0})
    assert reap_call(qapp).run(r).requeued == 0, "a queue the reaper was not given is left alone"
    assert r.zscore(qapp.keys.leases, job.id) == 0
    assert qapp.scripts.reap(max_stalls=3, limit=100, dead_ttl_ms=60_000, worker_ttl_ms=60_000,
                             result_ttl_ms=60_000, queues=["b"]).run(r).requeued == 1  # fmt: skip
    assert r.zscore(qapp.keys.ready_of("b"), job.id) is not None
    assert r.zscore(qapp.keys.ready, job.id) is None


async def test_a_worker_reaps_jobs_of_queues_it_does_not_serve(qapp: drumbeat.App) -> None:
    @qapp.task(queue="builds")
    async def build() -> None: ...

    job = await build.aenqueue()
    r = qapp.redis
    [claimed] = qapp.scripts.claim("crashed", 1, 1, 10, queues=["builds"]).run(r).jobs
    # The worker is idle once the expired lease is gone; the job is not its to run.
    assert await arun_until_idle(qapp, queues=["default"]) == 0
    assert r.zscore(qapp.keys.ready_of("builds"), job.id) is not None, (
        "the expired lease was not requeued into its queue"
    )
    assert claimed.id == job.id


async def test_a_dead_letter_is_retried_into_its_own_queue(
    qapp: drumbeat.App, r: redis.Redis
) -> None:
    @qapp.task(queue="builds")
    async def build() -> None:
        raise RuntimeError("no compiler")

    job = await build.aenqueue()
    async with running_worker(qapp):
        with pytest.raises(drumbeat.JobFailed):
            await job.aresult(timeout=10)
    assert admin.retry_dead(qapp, [job.id]).jobs == 1
    assert r.zscore(qapp.keys.ready_of("builds"), job.id) is not None
    assert r.zscore(qapp.keys.ready, job.id) is None
    assert await job.astatus() == "queued"


def test_status_counts_each_queue_per_priority(qapp: drumbeat.App) -> None:
    @qapp.task(queue="builds")
    def build() -> None: ...

    @qapp.task
    def mail() -> None: ...

    build.options(priority=7).enqueue()
    build.enqueue()
    build.enqueue()
    build.options(delay=60).enqueue()
    mail.options(priority=3).enqueue()
    stats = admin.queue_stats(qapp)
    by_name = {q.name: q for q in stats.queues}
    assert list(by_name) == ["default", "builds"]
    assert by_name["builds"].ready_by_priority == (2, 0, 0, 0, 0, 0, 0, 1, 0, 0)
    assert by_name["builds"].delayed == 1
    assert by_name["default"].ready_by_priority == (0, 0, 0, 1, 0, 0, 0, 0, 0, 0)
    assert stats.ready == 4 and stats.delayed == 1
    # What the dashboard and drumbeat_queue_ready{queue,priority} show.
    assert admin.ready_by_queue(stats) == {
        "default": (0, 0, 0, 1, 0, 0, 0, 0, 0, 0),
        "builds": (2, 0, 0, 0, 0, 0, 0, 1, 0, 0),
    }


def test_drumbeat_status_shows_the_queues(
    monkeypatch: pytest.MonkeyPatch, qapp: drumbeat.App, redis_url: str
) -> None:
    monkeypatch.setenv("DRUMBEAT_REDIS_URL", redis_url)
    monkeypatch.setenv("DRUMBEAT_TEST_NAMESPACE", qapp.settings.namespace)
    monkeypatch.setenv("COLUMNS", "200")
    _forget_app_module()
    try:
        _place(qapp, [("x", "builds", 4), ("y", "builds", 4), ("z", "default", 1)])
        shown = ok("status", APP).stdout
        assert "Queues" in shown, shown
        assert row(shown, "builds")[1:3] == ["2", "4: 2"], shown
        assert row(shown, "default")[1:3] == ["1", "1: 1"], shown
        listed = json.loads(ok("status", APP, "--json").stdout)["queues"]
        assert [(q["name"], q["ready"], q["ready_by_priority"][4]) for q in listed] == [
            ("default", 1, 0), ("builds", 2, 2)
        ]  # fmt: skip
    finally:
        _forget_app_module()


def test_drumbeat_worker_refuses_a_bad_queue_name(
    monkeypatch: pytest.MonkeyPatch, qapp: drumbeat.App, redis_url: str
) -> None:
    monkeypatch.setenv("DRUMBEAT_REDIS_URL", redis_url)
    monkeypatch.setenv("DRUMBEAT_TEST_NAMESPACE", qapp.settings.namespace)
    _forget_app_module()
    try:
        assert_clean_error(run("worker", APP, "--queues", "builds,has space"), 2,
                           "--queues: queue name 'has space'")  # fmt: skip
        assert_clean_error(run("worker", APP, "--queues", " , "), 2,
                           "--queues expects queue names")  # fmt: skip
    finally:
        _forget_app_module()


# -- rolling deploys: a task this worker does not know -----------------------------------------


def _log_every_command(r: redis.Redis) -> None:
    """Puts every command from now on in the SLOWLOG, to tell the scripts apart."""
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 100_000)
    r.slowlog_reset()


def _logged_calls(r: redis.Redis) -> Counter[str]:
    """The calls in the SLOWLOG since `_log_every_command`: scripts by name, other commands."""
    names = {sha.encode(): name for name, sha in SHAS.items()}
    out: Counter[str] = Counter()
    for entry in r.slowlog_get(100_000):
        words = entry["command"].split()
        out[names.get(words[1], "?") if words[0] == b"EVALSHA" else words[0].decode()] += 1
    return out


def _old_and_new(url: str, namespace: str, **settings: float) -> tuple[drumbeat.App, drumbeat.App]:
    """Two versions of one app: the new one has a task the old one lacks."""
    old = drumbeat.App(url, namespace=namespace, idle_block=0.5, **settings)
    new = drumbeat.App(url, namespace=namespace, idle_block=0.5, **settings)

    @old.task(name="tasks.existing")
    async def existing_old() -> None: ...

    @new.task(name="tasks.existing")
    async def existing_new() -> None: ...

    @new.task(name="tasks.added")
    async def added(n: int) -> str:
        ctx = drumbeat.current_job()
        return f"{n} attempt {ctx.attempt} on {ctx.worker}"

    return old, new


async def test_an_unknown_task_is_handed_back_then_run_by_a_worker_that_knows_it(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    old, new = _old_and_new(redis_url, namespace)
    try:
        job = await new.aenqueue("tasks.added", 7)
        async with running_worker(old) as old_worker:
            state = await wait_for_async(lambda: _state(r, old, job.id),
                             lambda s: s["unknown"] != "0",
                             message="the old worker did not hand the job back")  # fmt: skip
            assert state["attempt"] == "0", "a hand-back for an unknown task spent an attempt"
            assert await job.astatus() in ("scheduled", "queued", "running")
            assert r.zscore(old.keys.dead, job.id) is None
        # The old worker has left (while it stays, it may win the job again and again: each
        # win hands it back for longer; seen in CI), and a worker that knows the task runs it.
        async with running_worker(new) as new_worker:
            result = await job.aresult(timeout=20)
        assert result == f"7 attempt 1 on {new_worker.id}", result
        assert old_worker.failed == 0
    finally:
        await old.aclose()
        await new.aclose()


async def test_an_unknown_task_is_dead_lettered_after_the_grace(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    old, new = _old_and_new(redis_url, namespace, unknown_task_grace=1.0)
    try:
        job = await new.aenqueue("tasks.added", 1)
        async with running_worker(old):
            first = await wait_for_async(
                lambda: _state(r, old, job.id), lambda s: s["unknown"] != "0",
                message="the old worker did not hand the job back",
            )  # fmt: skip
            with pytest.raises(drumbeat.JobFailed) as failed:
                await job.aresult(timeout=20)
        died = r.zscore(old.keys.dead, job.id)
        assert died is not None
        assert died - int(first["unknown"]) >= 1000, "dead-lettered before the grace"
        message = str(failed.value)
        assert "no task named 'tasks.added'" in message, message
        assert "unknown_task_grace is 1 s" in message, message
    finally:
        await old.aclose()
        await new.aclose()


async def test_a_worker_lacking_the_task_does_not_spin_on_it(
    own_redis: RedisServer, own_r: redis.Redis, namespace: str
) -> None:
    old, new = _old_and_new(own_redis.url, namespace, maintenance_interval=60.0, lease=120.0)
    try:
        job = await new.aenqueue("tasks.added", 1)
        async with running_worker(old):
            # (Redis ms, idle waits, due score) at each hand-back seen; every command from the
            # first on.
            handed: list[tuple[int, int, float]] = []

            def handed_back_again() -> bool:
                score = own_r.zscore(old.keys.due, job.id)
                if score is not None and (not handed or score != handed[-1][2]):
                    if not handed:
                        _log_every_command(own_r)
                    handed.append((redis_now_ms(own_r), commands(own_r, "bzpopmin"), score))
                return len(handed) >= 4

            await wait_for_async(handed_back_again, interval=0.01,
                                 message="the job was not handed back 4 times")  # fmt: skip
            logged = _logged_calls(own_r)
            assert await job.astatus() != "dead"
        (t0, pops0, _), (t3, pops3, _) = handed[0], handed[-1]
        # Each hand-back waits at least a second before the job can be claimed again; in
        # between, the worker sends one claim and one hand-back per hand-back, besides the one
        # claim per idle wait it sends anyway (idle_block), not a stream of them; and its
        # time-slot lane one claim per claim of jobs.
        assert t3 - t0 >= 2500, f"3 hand-backs within {t3 - t0} ms: no wait between them"
        calls, waits = logged["claim"] + logged["defer_unknown"], pops3 - pops0
        assert calls <= 3 * 2 + waits + 2, (
            f"{calls} script calls for 3 hand-backs, {waits} waits: {logged}"
        )
        assert logged["claim_slots"] <= logged["claim"] + 1, logged
    finally:
        await old.aclose()
        await new.aclose()


async def test_a_schedule_whose_run_is_parked_is_not_put_back_in_its_slot(
    redis_url: str, namespace: str, r: redis.Redis
) -> None:
    """A run parked on a limiter waits neither queued nor leased: a re-registration of its
    schedule (every deploy does one), or a pause and resume, must still see the run and leave
    the schedule out of its slots, or the schedule would run twice at once."""
    app = drumbeat.App(redis_url, namespace=namespace, idle_block=0.5)
    app.limiter("gate", concurrency=1)
    release = asyncio.Event()

    @app.task(name="tasks.hold", limiter="gate")
    async def hold() -> None:
        await release.wait()

    @app.task(name="tasks.tick", limiter="gate")
    async def tick(n: int) -> None: ...

    def entries_of(schedule_id: str) -> int:
        slots = [int(ms) for ms in r.zrange(keys.slots, 0, -1)]
        held = [e for ms in slots for e in r.lrange(keys.slot(ms), 0, -1)]
        return sum(e.startswith(f"{schedule_id}|".encode()) for e in held)

    try:
        app.schedule("parked", tick, every=60, args=[1])
        keys = app.scheduler.shards[app.scheduler.shard_of("parked")]
        held = await hold.aenqueue()
        async with running_worker(app):
            await wait_for_async(held.astatus, lambda s: s == "running",
                                 message="the job holding the limiter did not start")  # fmt: skip
            set_due(r, app, "parked", redis_now_ms(r))
            await wait_for_async(
                lambda: (r.hexists(keys.state, "s:parked"), r.zscore(keys.leases, "s:parked"),
                         r.zscore(keys.ready, "s:parked"), r.hget(keys.where, "parked")),
                lambda seen: seen == (True, None, None, b"q"),
                message="the run was not parked behind the limiter",
            )  # fmt: skip
            app.schedule("parked", tick, every=60, args=[2])  # a changed definition
            assert entries_of("parked") == 0, "a second entry while its parked run waits"
            assert app.pause("parked") == 1
            assert app.resume("parked") == 1
            assert entries_of("parked") == 0, "resume put it back while its run waits"
            release.set()
            await held.aresult(timeout=20)
            await wait_for_async(lambda: entries_of("parked"), lambda n: n == 1,
                                 message="the run did not end and reschedule")  # fmt: skip
        info = app.get_schedule("parked")
        assert info is not None and info.args == [2] and not info.paused
    finally:
        release.set()
        await app.aclose()


# -- schedules of other queues -----------------------------------------------------------------


def _due_now(r: redis.Redis, app: drumbeat.App, schedule_id: str) -> None:
    """Makes a waiting schedule's next run due now."""
    set_due(r, app, schedule_id, redis_now_ms(r))


async def _runs_of(ran: dict[str, list[str]], n: int) -> None:
    for schedule_id in ("by-task", "named"):
        await wait_for_async(
            lambda s=schedule_id: ran.get(s, []),
            lambda seen: len(seen) == n,
            message=f"{schedule_id} did not run {n} time(s) in its queue",
        )


async def test_a_schedules_runs_go_to_its_tasks_queue_or_the_one_it_names(
    qapp: drumbeat.App, r: redis.Redis
) -> None:
    """The default queue's workers keep the schedules; each run waits in its schedule's queue
    (its task's, or the one `schedule(queue=...)` names, which no task of the app names) and
    only that queue's workers run it."""
    ran: dict[str, list[str]] = {}

    @qapp.task(queue="builds")
    async def build(schedule: str) -> None:
        ran.setdefault(schedule, []).append(drumbeat.current_job().worker)

    @qapp.task
    async def plain(schedule: str) -> None:
        ran.setdefault(schedule, []).append(drumbeat.current_job().worker)

    qapp.schedule("by-task", build, every=60, args=["by-task"])
    qapp.schedule("named", plain, every=60, args=["named"], queue="reports")
    assert {s.id: s.queue for s in qapp.schedules()} == {"by-task": "builds", "named": "reports"}
    shown = qapp.get_schedule("named")
    assert shown is not None and schedule_json(shown, "scheduled")["queue"] == "reports"
    assert "reports" in qapp.known_queues(), "the schedule's queue is not in the registry"
    async with running_worker(qapp, queues=["default"]) as keeper:
        for schedule_id in ("by-task", "named"):
            _due_now(r, qapp, schedule_id)
        # Queued by the default queue's worker into their queues, where nobody serves them.
        for schedule_id, queue in (("by-task", "builds"), ("named", "reports")):
            await wait_for_async(
                lambda s=schedule_id, q=queue: r.zscore(qapp.keys.ready_of(q), f"s:{s}"),
                lambda score: score is not None,
                message=f"the run of {schedule_id} did not reach queue {queue}",
            )
        async with running_worker(qapp, queues=["builds", "reports"]) as other:
            await _runs_of(ran, 1)
            # Its cadence goes on: the next run too.
            for schedule_id in ("by-task", "named"):
                await wait_for_async(
                    lambda s=schedule_id: qapp.get_schedule(s),
                    lambda info: info is not None and info.next_due_ms is not None,
                    message=f"{schedule_id} was not rescheduled",
                )
                _due_now(r, qapp, schedule_id)
            await _runs_of(ran, 2)
    assert ran == {"by-task": [other.id] * 2, "named": [other.id] * 2}, (keeper.id, ran)


async def test_a_schedule_of_another_queue_runs_there_with_schedule_shards(
    redis_url: str, namespace: str
) -> None:
    """With schedule_shards > 1 a schedule routed to another queue lives in the jobs' shard,
    where the queues are, so its runs reach their queue."""
    app = drumbeat.App(redis_url, namespace=namespace, schedule_shards=2, min_interval=0.05,
                       idle_block=0.5)  # fmt: skip
    seen: list[str] = []

    @app.task(queue="builds")
    async def build() -> None:
        seen.append(drumbeat.current_job().job_id)

    with pytest.raises(InvalidJob, match="queue name 'no space'"):
        await app.aschedule("b", build, every=60, queue="no space")
    await app.aschedule("b", build, every=0.1)
    assert app.scheduler.home_of(app.redis, "b") == app.scheduler.jobs_shard
    async with running_worker(app, queues=["default", "builds"]):
        await wait_for_async(lambda: len(seen) >= 2, message="its runs run in 'builds'")
    await app.aunschedule("b")
    assert set(seen) == {"s:b"}
    await app.aclose()
