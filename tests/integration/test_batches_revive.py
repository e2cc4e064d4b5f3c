"""Batch members brought back from the dead set (`drumbeat dead retry`, lua/revive.lua): a
member of a batch that has not ended counts in it again, once; one whose batch ended runs
outside it; and the retry counts the dependents that came back with the dead jobs
(docs/workflows.md, *Batches*)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

import drumbeat
from drumbeat import JobStatus, admin
from drumbeat.testing import arun_until_idle
from tests.integration.test_cli import APP, _forget_app_module, ok


def _tasks(
    app: drumbeat.App, fails: list[str], ran: list[str]
) -> tuple[drumbeat.Task[[str], None], drumbeat.Task[[str], None]]:
    """``step`` records its runs and fails once for each time its name is in ``fails``;
    ``callback`` records its runs as ``"cb:<name>"``."""

    @app.task
    async def step(name: str) -> None:
        ran.append(name)
        if name in fails:
            fails.remove(name)
            raise RuntimeError(f"{name} failed")

    @app.task
    async def callback(name: str) -> None:
        ran.append("cb:" + name)

    return step, callback


async def test_a_revived_member_counts_in_its_batch_again_once(
    app: drumbeat.App, r: redis.Redis
) -> None:
    fails, ran = ["a", "a"], []
    step, callback = _tasks(app, fails, ran)
    batch = await app.abatch(
        [step.prepare("a"), step.options(queue="later").prepare("c")],
        on_complete=callback.prepare("complete"),
        on_success=callback.prepare("success"),
    )
    a = batch.jobs[0]
    await arun_until_idle(app)  # "a" dies; "c" waits in a queue nobody serves yet
    assert await a.astatus() is JobStatus.DEAD
    status = await batch.astatus()
    assert (status.pending, status.failed, status.ended) == (1, 1, False)

    assert admin.retry_dead(app, [a.id]) == admin.Revived(jobs=1)
    status = await batch.astatus()
    assert (status.pending, status.failed, status.succeeded) == (2, 0, 0)
    assert await batch.afailed_ids() == []

    await arun_until_idle(app)  # it fails again: counted once more, listed once
    status = await batch.astatus()
    assert (status.pending, status.failed, status.ended) == (1, 1, False)
    assert await batch.afailed_ids() == [a.id]

    assert admin.retry_dead(app, None) == admin.Revived(jobs=1)
    await arun_until_idle(app, queues=["default", "later"])
    status = await batch.astatus()
    assert status.ended and dict(status) == {
        "total": 2, "pending": 0, "succeeded": 2, "failed": 0, "cancelled": 0
    }  # fmt: skip
    assert await batch.afailed_ids() == []
    # Every member succeeded in the end: on_success runs, and each callback once, last.
    assert sorted(ran[:4]) == ["a", "a", "a", "c"]
    assert sorted(ran[4:]) == ["cb:complete", "cb:success"]
    assert not r.exists(app.keys.orphans, app.keys.members)


async def test_a_member_of_an_ended_batch_runs_outside_it(
    app: drumbeat.App, r: redis.Redis
) -> None:
    fails, ran = ["a"], []
    step, callback = _tasks(app, fails, ran)
    batch = await app.abatch(
        [step.prepare("a"), step.prepare("b")], on_complete=callback.prepare("complete")
    )
    a = batch.jobs[0]
    await arun_until_idle(app)
    ended = await batch.astatus()
    assert ended.ended and ended.failed == 1 and ran.count("cb:complete") == 1

    # The batch ended and called back: it is not reopened; the job runs on its own.
    assert admin.retry_dead(app, [a.id]) == admin.Revived(jobs=1, outside_batch=1)
    await arun_until_idle(app)
    assert await a.astatus() is JobStatus.COMPLETE
    assert ran.count("a") == 2 and ran.count("cb:complete") == 1
    assert await batch.astatus() == ended
    assert await batch.afailed_ids() == [a.id]
    assert not r.exists(app.keys.orphans, app.keys.members)


async def test_a_cancelled_batch_is_not_reopened_by_a_revived_member(
    app: drumbeat.App,
) -> None:
    fails, ran = ["a"], []
    step, callback = _tasks(app, fails, ran)
    batch = await app.abatch(
        [step.prepare("a"), step.options(queue="later").prepare("c")],
        on_complete=callback.prepare("complete"),
    )
    await arun_until_idle(app)
    await batch.acancel()
    assert admin.retry_dead(app, None) == admin.Revived(jobs=1, outside_batch=1)
    await arun_until_idle(app, queues=["default", "later"])
    status = await batch.astatus()
    assert status.state == "cancelled" and status.failed == 1
    assert "cb:complete" not in ran and ran.count("a") == 2


async def test_dependents_back_from_the_dead_count_in_their_batch_again(
    app: drumbeat.App, r: redis.Redis
) -> None:
    fails, ran = ["x"], []
    step, callback = _tasks(app, fails, ran)
    x = await step.aenqueue("x")  # no member: the members wait for it
    batch = await app.abatch(
        [
            step.options(depends_on=x).prepare("d1"),
            step.options(depends_on=x).prepare("d2"),
            step.options(queue="later").prepare("c"),
        ],
        on_success=callback.prepare("success"),
    )
    await arun_until_idle(app)
    status = await batch.astatus()
    assert (status.pending, status.failed) == (1, 2)

    revived = admin.retry_dead(app, [x.id])
    assert revived == admin.Revived(jobs=1, dependents=2)
    status = await batch.astatus()
    assert (status.pending, status.failed) == (3, 0)
    await arun_until_idle(app, queues=["default", "later"])
    status = await batch.astatus()
    assert status.ended and (status.succeeded, status.failed) == (3, 0)
    assert ran.count("cb:success") == 1
    assert not r.exists(app.keys.orphans, app.keys.members)


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, namespace: str) -> Iterator[None]:
    monkeypatch.setenv("DRUMBEAT_REDIS_URL", redis_url)
    monkeypatch.setenv("DRUMBEAT_TEST_NAMESPACE", namespace)
    monkeypatch.setenv("COLUMNS", "250")  # the message on one line
    _forget_app_module()
    yield
    _forget_app_module()


async def test_dead_retry_says_how_many_dependents_came_back(
    cli_env: None, app: drumbeat.App
) -> None:
    fails, ran = ["a", "p"], []
    step, _ = _tasks(app, fails, ran)
    app.chain([step.prepare("a"), step.prepare("b"), step.prepare("c")])
    await step.aenqueue("p")
    await arun_until_idle(app)
    assert admin.dead_count(app) == 4
    out = ok("dead", "retry", APP, "--all")
    assert "requeued 2 jobs and 2 dependents that were dead-lettered with them" in out.stdout
    assert "note" not in out.stderr

    # A member of a batch that ended comes back outside it, and the retry says so.
    fails.append("m")
    batch = await app.abatch([step.prepare("m")])
    await arun_until_idle(app)
    assert (await batch.astatus()).ended
    out = ok("dead", "retry", APP, batch.jobs[0].id)
    assert "requeued 1 job" in out.stdout and "dependent" not in out.stdout
    assert "1 of them were members of a batch that had already ended" in out.stderr
