"""Workflows after `drumbeat dead retry`: retrying a dead-lettered dependency brings back the
dependents it dead-lettered to wait for it (lua/_workflows.lua: orphans), and dependents
dead-lettered through a dependency are counted in the metrics (docs/workflows.md)."""

from __future__ import annotations

import redis

import drumbeat
from drumbeat import JobStatus, admin
from drumbeat.job_ids import job_shard_of
from drumbeat.metrics import job_counts
from drumbeat.testing import arun_until_idle


def _flaky(
    app: drumbeat.App, order: list[str], fails: set[str], name: str = "step"
) -> drumbeat.Task[[str], None]:
    """A task that records its runs and fails once for each name in ``fails``."""

    @app.task(name=name)
    async def step(name: str) -> None:
        order.append(name)
        if name in fails:
            fails.discard(name)
            raise RuntimeError(f"{name} failed")

    return step


async def test_retrying_a_dead_dependency_brings_its_dead_chain_back_to_wait(
    app: drumbeat.App, r: redis.Redis
) -> None:
    order: list[str] = []
    step = _flaky(app, order, {"a"})
    a, b, c = app.chain([step.prepare("a"), step.prepare("b"), step.prepare("c")])
    await arun_until_idle(app)
    assert [await j.astatus() for j in (a, b, c)] == [JobStatus.DEAD] * 3

    assert admin.retry_dead(app, [a.id]).jobs == 1
    # Back to waiting for the step before them, not queued: they must not run before it.
    assert [await j.astatus() for j in (a, b, c)] == [
        JobStatus.QUEUED, JobStatus.WAITING, JobStatus.WAITING,
    ]  # fmt: skip
    assert admin.dead_count(app) == 0
    order.clear()
    await arun_until_idle(app)
    assert order == ["a", "b", "c"]
    assert [await j.astatus() for j in (a, b, c)] == [JobStatus.COMPLETE] * 3
    assert await c.aresult(timeout=1) is None
    assert not r.exists(app.keys.orphans, app.keys.deps, app.keys.edges, app.keys.dependents)


async def test_a_dependent_back_from_the_dead_still_waits_for_its_other_dependencies(
    app: drumbeat.App, r: redis.Redis
) -> None:
    order: list[str] = []
    step = _flaky(app, order, {"y"})
    done_early = await step.aenqueue("x")  # completes before y fails: counts as ended
    later = await step.options(queue="later").aenqueue("z")  # runs only after the retry
    y = await step.aenqueue("y")
    join = await step.options(depends_on=[done_early, later, y]).aenqueue("join")
    await arun_until_idle(app)
    assert await join.astatus() is JobStatus.DEAD
    # A dependency ending while its dependent is dead-lettered is counted all the same.
    await arun_until_idle(app, queues=["later"])
    assert order == ["x", "y", "z"]

    assert admin.retry_dead(app, None).jobs == 1
    assert await join.astatus() is JobStatus.WAITING
    await arun_until_idle(app)
    assert order == ["x", "y", "z", "y", "join"]
    assert not r.exists(app.keys.orphans)

    # And one whose other dependency is still live at the retry waits for that one too.
    order.clear()
    step2 = _flaky(app, order, {"v"}, name="step2")
    u = await step2.options(queue="later").aenqueue("u")
    v = await step2.aenqueue("v")
    join2 = await step2.options(depends_on=[u, v]).aenqueue("join2")
    await arun_until_idle(app)
    assert await join2.astatus() is JobStatus.DEAD
    assert admin.retry_dead(app, [v.id]).jobs == 1
    await arun_until_idle(app)
    assert await join2.astatus() is JobStatus.WAITING, "u has not run yet"
    await arun_until_idle(app, queues=["later", "default"])
    assert order == ["v", "v", "u", "join2"]
    assert not r.exists(app.keys.orphans, app.keys.deps)


async def test_retrying_a_dependency_with_its_dependents_makes_them_wait_for_it(
    app: drumbeat.App,
) -> None:
    order: list[str] = []
    step = _flaky(app, order, {"a"})
    a = await step.aenqueue("a")
    await arun_until_idle(app)
    # Enqueued after its dependency died: dead-lettered at once, and brought back as well.
    b = await step.options(depends_on=a).aenqueue("b")
    assert await b.astatus() is JobStatus.DEAD
    # Dependent first in the call: it still comes back to wait, not to run at once.
    assert admin.retry_dead(app, [b.id, a.id]).jobs == 1
    assert await b.astatus() is JobStatus.WAITING
    order.clear()
    await arun_until_idle(app)
    assert order == ["a", "b"]


async def test_a_dependency_failing_again_dead_letters_its_dependents_again(
    app: drumbeat.App, r: redis.Redis
) -> None:
    order: list[str] = []
    fails = {"a"}
    step = _flaky(app, order, fails)
    a, b = app.chain([step.prepare("a"), step.prepare("b")])
    await arun_until_idle(app)
    fails.add("a")
    assert admin.retry_dead(app, [a.id]).jobs == 1
    order.clear()
    await arun_until_idle(app)
    assert order == ["a"]
    assert await b.astatus() is JobStatus.DEAD
    # Purged for good: nothing of it is kept, and its dependent can only be retried itself.
    assert admin.purge_dead(app, [a.id]) == 1
    assert not r.exists(app.keys.orphans)
    assert admin.retry_dead(app, None).jobs == 1
    assert await b.astatus() is JobStatus.QUEUED


async def test_dependents_dead_lettered_through_a_dependency_are_counted_in_metrics(
    app: drumbeat.App,
) -> None:
    order: list[str] = []
    step = _flaky(app, order, {"a"})

    @app.task
    async def other() -> None: ...

    app.chain([step.prepare("a"), step.prepare("b"), other.prepare()])
    await arun_until_idle(app)
    jobs = job_counts(app).jobs
    # "a" by its worker, "b" and the last step by the script that dead-lettered them.
    assert jobs[step.name, "dead"] == 2
    assert jobs[other.name, "dead"] == 1


async def test_dependents_dead_lettered_in_every_job_shard_are_counted(
    redis_url: str, namespace: str
) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, job_shards=3)
    try:

        @app.task
        async def boom() -> None:
            raise RuntimeError("no")

        @app.task
        async def after() -> None: ...

        chains = [app.chain([boom.prepare(), after.prepare()]) for _ in range(6)]
        shards = {job_shard_of(c[1].id) for c in chains}
        assert len(shards) > 1, "chains go to the job shards in turn"
        await arun_until_idle(app)
        assert job_counts(app).jobs[after.name, "dead"] == 6
    finally:
        await app.aclose()
