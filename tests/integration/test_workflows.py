"""Workflows: jobs that wait for other jobs (``options(depends_on=...)``) and chains of them,
on a real Redis and a real worker (docs/workflows.md)."""

from __future__ import annotations

import asyncio
import uuid
import zlib
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

import drumbeat
from drumbeat import Dependency, JobStatus, admin, current_job
from drumbeat.cli.tables import summary_table
from drumbeat.errors import JobFailed
from drumbeat.job import encode_success
from drumbeat.job_ids import job_shard_of
from drumbeat.testing import arun_until_idle
from tests.conftest import reap_call


def _claim(app: drumbeat.App, r: redis.Redis, worker: str = "w") -> Any:
    return app.scripts.claim(worker, 1, 10_000, 100).run(r).jobs


def _ack(app: drumbeat.App, r: redis.Redis, claimed: Any, value: Any = None) -> list[int]:
    outcome = encode_success(app.codec, value, 1 << 20)
    return app.scripts.complete([(claimed.id, claimed.token, outcome, 60_000, "")]).run(r)


async def test_a_dependent_runs_after_its_dependencies_with_their_handles(
    app: drumbeat.App,
) -> None:
    order: list[str] = []
    seen: list[Any] = []

    @app.task
    async def step(name: str) -> str:
        order.append(name)
        return name.upper()

    @app.task
    async def join() -> None:
        order.append("join")
        seen.extend([await d.aresult(timeout=1) for d in current_job().dependencies])

    a, b = await step.aenqueue("a"), await step.aenqueue("b")
    # Enqueued first in line and at a higher priority: it still waits.
    last = await join.options(depends_on=[a, b.id], priority=9).aenqueue()
    assert await last.astatus() is JobStatus.WAITING
    await arun_until_idle(app)
    assert order[-1] == "join" and sorted(order[:2]) == ["a", "b"]
    assert seen == ["A", "B"]
    assert await last.astatus() is JobStatus.COMPLETE


async def test_a_failed_dependency_dead_letters_its_dependents_at_once_naming_it(
    app: drumbeat.App,
) -> None:
    ran: list[str] = []

    @app.task
    async def boom() -> None:
        raise RuntimeError("no")

    @app.task
    async def after(name: str) -> None:
        ran.append(name)

    failing = await boom.aenqueue()
    child = await after.options(depends_on=failing).aenqueue("child")
    grandchild = await after.options(depends_on=[child]).aenqueue("grandchild")
    tolerant = await after.options(depends_on=Dependency(failing, allow_failure=True)).aenqueue(
        "tolerant"
    )
    await arun_until_idle(app)
    assert ran == ["tolerant"]
    with pytest.raises(JobFailed, match=f"dependency {failing.id} failed"):
        await child.aresult(timeout=1)
    with pytest.raises(JobFailed, match=f"dependency {child.id} failed"):
        await grandchild.aresult(timeout=1)
    assert await grandchild.astatus() is JobStatus.DEAD
    assert await tolerant.astatus() is JobStatus.COMPLETE


async def test_allow_failure_is_per_dependency(app: drumbeat.App) -> None:
    @app.task
    async def boom() -> None:
        raise RuntimeError("no")

    @app.task
    async def fine() -> None: ...

    bad, good = await boom.aenqueue(), await fine.aenqueue()
    may_fail = await fine.options(
        depends_on=[Dependency([bad], allow_failure=True), good]
    ).aenqueue()
    must_not = await fine.options(
        depends_on=[Dependency([good], allow_failure=True), bad]
    ).aenqueue()
    await arun_until_idle(app)
    assert await may_fail.astatus() is JobStatus.COMPLETE
    with pytest.raises(JobFailed, match=f"dependency {bad.id} failed"):
        await must_not.aresult(timeout=1)


async def test_cancelling_waiting_jobs_and_dependencies(app: drumbeat.App) -> None:
    @app.task
    async def work() -> None: ...

    # A dependency cancelled while queued: its dependent is dead-lettered, naming it.
    first = await work.aenqueue()
    waiting = await work.options(depends_on=first).aenqueue()
    assert await first.acancel()
    with pytest.raises(JobFailed, match=f"dependency {first.id} was cancelled"):
        await waiting.aresult(timeout=1)
    # A waiting dependent cancelled: cancelled at once, and so its own dependent fails; its
    # dependency runs, and releases nothing.
    second = await work.aenqueue()
    middle = await work.options(depends_on=second).aenqueue()
    last = await work.options(depends_on=middle).aenqueue()
    assert await middle.acancel()
    assert await middle.astatus() is JobStatus.CANCELLED
    assert await last.astatus() is JobStatus.DEAD
    assert await arun_until_idle(app) == 1
    assert await second.astatus() is JobStatus.COMPLETE


async def test_dependencies_that_already_ended_count_at_once(app: drumbeat.App) -> None:
    @app.task
    async def work(fail: bool = False) -> None:
        if fail:
            raise RuntimeError("no")

    done, dead = await work.aenqueue(), await work.aenqueue(True)
    await arun_until_idle(app)
    ready = await work.options(depends_on=done).aenqueue()
    assert await ready.astatus() is JobStatus.QUEUED
    failed = await work.options(depends_on=[done, dead]).aenqueue()
    with pytest.raises(JobFailed, match=f"dependency {dead.id} failed"):
        await failed.aresult(timeout=1)
    allowed = await work.options(depends_on=Dependency([dead], allow_failure=True)).aenqueue()
    assert await allowed.astatus() is JobStatus.QUEUED
    assert await arun_until_idle(app) == 2


async def test_an_unknown_or_forgotten_dependency_is_refused_and_nothing_written(
    app: drumbeat.App, r: redis.Redis
) -> None:
    @app.task(result_ttl=0)
    async def forgetful() -> None: ...

    @app.task
    async def work() -> None: ...

    gone = await forgetful.aenqueue()
    await arun_until_idle(app)
    for unknown in ("0" * 32, gone.id):
        with pytest.raises(drumbeat.UnknownDependency, match=unknown):
            await work.options(depends_on=unknown).aenqueue()
    assert r.hlen(app.keys.jobs) <= 1  # only the `~` field: nothing was written
    with pytest.raises(drumbeat.InvalidJob, match="delay"):
        work.options(depends_on=gone, delay=1).prepare()
        await work.options(depends_on=gone, delay=1).aenqueue()
    with pytest.raises(drumbeat.InvalidJob, match="schedule's run"):
        work.options(depends_on="s:nightly")


def test_sync_enqueue_many_and_task_ref_take_depends_on(redis_url: str, namespace: str) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    try:

        @app.task
        def work(n: int) -> int:
            return n

        first = work.enqueue(1)
        by_name = app.task_ref(work.name).options(depends_on=[first]).prepare(2)
        plain = work.options(depends_on=first).prepare(3)
        jobs = app.enqueue_many([by_name, plain])
        assert [j.status() for j in jobs] == [JobStatus.WAITING] * 2
        drumbeat.testing.run_until_idle(app)
        assert [j.result(timeout=1) for j in jobs] == [2, 3]
    finally:
        app.close()


async def test_a_stale_ack_releases_nothing(app: drumbeat.App, r: redis.Redis) -> None:
    @app.task
    async def work() -> None: ...

    dep = await work.aenqueue()
    dependent = await work.options(depends_on=dep).aenqueue()
    first = _claim(app, r, "a")[0]
    r.zadd(app.keys.leases, {dep.id: 1})  # its lease lapses: another worker takes the job
    assert reap_call(app).run(r).requeued == 1
    second = _claim(app, r, "b")[0]
    assert _ack(app, r, first) == [0]  # fenced off: the dependent still waits
    failure = b'{"ok":false,"error":"stale"}'
    assert app.scripts.bury([(dep.id, first.token, failure, 60_000)]).run(r) == [0]
    cancelled = app.scripts.complete([(dep.id, first.token, b"{}", 60_000, "")], cancelled=True)
    assert cancelled.run(r) == [0]
    assert await dependent.astatus() is JobStatus.WAITING
    assert _ack(app, r, second) == [1]
    assert await dependent.astatus() is JobStatus.QUEUED
    assert _ack(app, r, second) == [0]  # an ack sent again releases nothing twice
    assert r.zcard(app.keys.ready) == 1


async def test_a_dependency_dead_lettered_by_its_stalls_settles_its_dependents(
    app: drumbeat.App, r: redis.Redis
) -> None:
    @app.task
    async def work() -> None: ...

    dep = await work.aenqueue()
    strict = await work.options(depends_on=dep).aenqueue()
    tolerant = await work.options(depends_on=Dependency(dep, allow_failure=True)).aenqueue()
    _claim(app, r)
    r.zadd(app.keys.leases, {dep.id: 1})
    reaped = reap_call(app, max_stalls=0).run(r)
    assert dep.id in reaped.buried and strict.id in reaped.buried
    assert await strict.astatus() is JobStatus.DEAD
    assert await tolerant.astatus() is JobStatus.QUEUED


async def test_a_dependent_of_another_queue_is_released_by_housekeeping(
    app: drumbeat.App, r: redis.Redis
) -> None:
    ran: list[str] = []

    @app.task
    async def build() -> None:
        ran.append("build")

    @app.task(queue="publish")
    async def publish() -> None:
        ran.append("publish")

    dep = await build.aenqueue()
    dependent = await publish.options(depends_on=dep).aenqueue()
    await arun_until_idle(app, queues=["default"])
    # Released into a queue the worker that completed its dependency had no keys of.
    assert r.zscore(app.keys.freed, dependent.id) is not None
    reap_call(app, **{}).run(r)  # the default queue only: it stays
    assert r.zscore(app.keys.freed, dependent.id) is not None
    app.scripts.reap(max_stalls=3, limit=100, dead_ttl_ms=60_000, worker_ttl_ms=60_000,
                     result_ttl_ms=60_000, queues=["publish"]).run(r)  # fmt: skip
    assert await dependent.astatus() is JobStatus.QUEUED
    await arun_until_idle(app, queues=["publish"])
    assert ran == ["build", "publish"]


async def test_dependencies_in_another_job_shard_are_refused(
    redis_url: str, namespace: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, job_shards=2)
    try:

        @app.task
        async def work() -> None: ...

        jobs = await app.aenqueue_many([work.prepare(), work.prepare()] * 300)
        by_shard = {job_shard_of(j.id): j for j in jobs}
        assert set(by_shard) == {0, 1}
        dependent = await work.options(depends_on=by_shard[1]).aenqueue()
        assert dependent.id.endswith(".1")  # it goes to its dependency's shard
        with pytest.raises(drumbeat.InvalidJob, match="share a job shard"):
            await work.options(depends_on=[by_shard[0], by_shard[1]]).aenqueue()
        # A dedup key places a job in the shard it hashes to: here the other one.
        key = next(f"k{i}" for i in range(100) if zlib.crc32(f"k{i}".encode()) % 2 == 0)
        with pytest.raises(drumbeat.InvalidJob, match="share a job shard"):
            await work.options(depends_on=by_shard[1], key=key).aenqueue()
    finally:
        await app.aclose()


async def test_a_chain_runs_its_steps_in_order(app: drumbeat.App) -> None:
    order: list[int] = []

    @app.task
    async def step(n: int) -> int:
        deps = current_job().dependencies
        before = await deps[0].aresult(timeout=1) if deps else 0
        order.append(n)
        return before + n

    extra = await step.aenqueue(0)
    jobs = await app.achain(
        [
            step.prepare(1),
            step.options(priority=9).prepare(2),
            step.options(depends_on=extra).prepare(3),
        ]
    )
    assert [await j.astatus() for j in jobs] == [
        JobStatus.QUEUED, JobStatus.WAITING, JobStatus.WAITING,
    ]  # fmt: skip
    await arun_until_idle(app)
    assert order.index(1) < order.index(2) < order.index(3)
    # The step before comes first among a step's dependencies, then its own.
    assert await jobs[-1].aresult(timeout=1) == 6


def test_a_failed_step_dead_letters_the_rest_of_its_chain(redis_url: str, namespace: str) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    try:

        @app.task
        def step(n: int) -> None:
            if n == 2:
                raise RuntimeError("step two")

        jobs = app.chain([step.prepare(1), step.prepare(2), step.prepare(3), step.prepare(4)])
        drumbeat.testing.run_until_idle(app)
        assert [j.status() for j in jobs] == ["complete", "dead", "dead", "dead"]
        with pytest.raises(JobFailed, match=f"dependency {jobs[2].id} failed"):
            jobs[3].result(timeout=1)
    finally:
        app.close()


async def test_a_worker_releases_dependents_into_every_queue_it_serves(
    app: drumbeat.App, r: redis.Redis
) -> None:
    ran: list[str] = []

    @app.task(queue="build")
    async def build() -> None:
        ran.append("build")

    @app.task(queue="publish")
    async def publish() -> None:
        ran.append("publish")

    dependent = await publish.options(depends_on=await build.aenqueue()).aenqueue()
    # One drain: the dependent goes straight to its queue's `ready`, not through `freed`.
    assert await arun_until_idle(app, queues=["build", "publish"]) == 2
    assert ran == ["build", "publish"]
    assert await dependent.astatus() is JobStatus.COMPLETE
    assert r.zcard(app.keys.freed) == 0


@st.composite
def _graphs(draw: st.DrawFn) -> list[tuple[bool, list[tuple[int, bool]]]]:
    """Small DAGs: job i (fails or not) depends on some jobs before it, each maybe allowed to
    fail."""
    n = draw(st.integers(min_value=1, max_value=8))
    return [
        (
            draw(st.booleans()),
            draw(st.lists(st.tuples(st.integers(0, i - 1), st.booleans()), max_size=3))
            if i
            else [],
        )
        for i in range(n)
    ]


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(graph=_graphs())
def test_random_graphs_run_each_job_after_its_dependencies_and_end_every_job(
    redis_url: str, graph: list[tuple[bool, list[tuple[int, bool]]]]
) -> None:
    app = drumbeat.App(redis_url, namespace="g" + uuid.uuid4().hex[:12])
    events: list[tuple[str, int]] = []
    try:

        @app.task
        async def node(i: int, fail: bool) -> None:
            events.append(("start", i))
            await asyncio.sleep(0)
            events.append(("end", i))
            if fail:
                raise RuntimeError(f"node {i}")

        jobs: list[drumbeat.Job[Any]] = []
        for i, (fail, deps) in enumerate(graph):
            depends_on = [Dependency(jobs[d], allow_failure=allowed) for d, allowed in deps]
            jobs.append(node.options(depends_on=depends_on).enqueue(i, fail))
        drumbeat.testing.run_until_idle(app, concurrency=4)

        # What should happen: a job runs unless a dependency it does not allow to fail did not
        # complete; it completes if it ran and does not fail.
        ran, ok = [False] * len(graph), [False] * len(graph)
        for i, (fail, deps) in enumerate(graph):
            allowed = {d: True for d, a in deps if a}
            ran[i] = all(ok[d] or allowed.get(d, False) for d, _ in deps)
            ok[i] = ran[i] and not fail
        started = [i for kind, i in events if kind == "start"]
        assert sorted(started) == [i for i in range(len(graph)) if ran[i]]
        for i, (_, deps) in enumerate(graph):
            if ran[i]:
                start = events.index(("start", i))
                for d, _ in deps:  # one that never ran was dead-lettered before it
                    if ran[d]:
                        assert events.index(("end", d)) < start, f"{i} started before {d} ended"
        statuses = [j.status() for j in jobs]
        assert statuses == [JobStatus.COMPLETE if k else JobStatus.DEAD for k in ok]
    finally:
        app.close()


def test_status_counts_the_jobs_waiting_for_dependencies(redis_url: str, namespace: str) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    try:

        @app.task
        def work() -> None: ...

        first = work.enqueue()
        app.chain([work.options(depends_on=first).prepare(), work.prepare()])
        stats = admin.queue_stats(app)
        assert (stats.ready, stats.waiting) == (1, 2)
        table = Console(width=120, record=True)
        table.print(summary_table(stats))
        assert "waiting (for dependencies)" in table.export_text()
        drumbeat.testing.run_until_idle(app)
        assert admin.queue_stats(app).waiting == 0
    finally:
        app.close()


async def test_a_dedup_key_makes_a_dependent_a_duplicate_as_it_does_any_job(
    app: drumbeat.App,
) -> None:
    @app.task
    async def work() -> None: ...

    first = await work.aenqueue()
    held = await work.options(key="nightly").aenqueue()
    dependent = await work.options(depends_on=first, key="nightly").aenqueue()
    assert dependent.duplicate and dependent.id == held.id
    await arun_until_idle(app)
    # A key kept taken for a window after its job ended (unique_for) holds for dependents too.
    windowed = await work.options(key="weekly", unique_for=60).aenqueue()
    await arun_until_idle(app)
    again = await work.options(depends_on=first, key="weekly").aenqueue()
    assert again.duplicate and again.id == windowed.id
    fresh = await work.options(depends_on=first, key="monthly").aenqueue()
    assert not fresh.duplicate and await fresh.astatus() is JobStatus.QUEUED


async def test_a_dependency_that_retries_releases_its_dependent_once_it_completes(
    app: drumbeat.App,
) -> None:
    attempts: list[int] = []
    ran: list[str] = []

    @app.task(retries=2, backoff=0.01)
    async def flaky() -> None:
        attempts.append(current_job().attempt)
        if len(attempts) < 3:
            raise RuntimeError("not yet")

    @app.task(concurrency_limit=1)
    async def after(name: str) -> None:
        ran.append(name)

    dep = await flaky.aenqueue()
    dependents = [await after.options(depends_on=dep).aenqueue(n) for n in ("x", "y")]
    await arun_until_idle(app)
    # The failed attempts released nothing; its dependents ran once each, under their limit.
    assert attempts == [1, 2, 3]
    assert sorted(ran) == ["x", "y"]
    assert [await d.astatus() for d in dependents] == [JobStatus.COMPLETE] * 2


def test_an_unknown_dependency_in_a_pipelined_call_is_refused_too(
    redis_url: str, namespace: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace)
    try:

        @app.task
        def work() -> None: ...

        @app.task(queue="later")
        def later() -> None: ...

        unknown = "f" * 32
        # Two queues: two script calls, the second pipelined after the first.
        with pytest.raises(drumbeat.UnknownDependency, match=unknown):
            app.enqueue_many([work.prepare(), later.options(depends_on=unknown).prepare()])
    finally:
        app.close()


async def test_hand_backs_and_retries_are_no_end_and_release_nothing(
    app: drumbeat.App, r: redis.Redis
) -> None:
    @app.task
    async def work() -> None: ...

    dep = await work.aenqueue()
    dependent = await work.options(depends_on=dep).aenqueue()
    claimed = _claim(app, r)[0]
    assert app.scripts.handback([(dep.id, claimed.token)]).run(r) == [1]  # a stop, a checkpoint
    assert await dependent.astatus() is JobStatus.WAITING
    claimed = _claim(app, r)[0]
    assert app.scripts.retry([(dep.id, claimed.token, 0, 0)]).run(r) == [1]
    assert await dependent.astatus() is JobStatus.WAITING
    await arun_until_idle(app)
    assert await dependent.astatus() is JobStatus.COMPLETE


async def test_a_chain_step_found_a_duplicate_is_waited_for_by_the_next_step(
    app: drumbeat.App,
) -> None:
    order: list[str] = []

    @app.task
    async def step(name: str) -> None:
        order.append(name)

    @app.task(queue="other")
    async def other(name: str) -> None:
        order.append(name)

    held = await step.options(key="fetch").aenqueue("held")
    # Steps of two queues (two script calls) and a step whose key is taken.
    jobs = await app.achain(
        [step.options(key="fetch").prepare("dup"), other.prepare("parse"), step.prepare("store")]
    )
    assert jobs[0].duplicate and jobs[0].id == held.id
    assert [await j.astatus() for j in jobs[1:]] == [JobStatus.WAITING] * 2
    await arun_until_idle(app, queues=["default", "other"])
    assert order == ["held", "parse", "store"]
