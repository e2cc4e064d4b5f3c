"""Enqueue by name (`App.task_ref`) on a real Redis: a producer that does not import the task
sets priority, delay, a dedup key and the queue as `Task.options` does, its arguments apart."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis

import drumbeat
from drumbeat.protocol import PRIORITY_SPAN
from tests.conftest import running_worker
from tests.helpers import redis_now_ms


@pytest.fixture
async def producer(redis_url: str, namespace: str) -> AsyncIterator[drumbeat.App]:
    """An app on the test's namespace that registers no task: a producer elsewhere."""
    a = drumbeat.App(redis_url, namespace=namespace)
    yield a
    await a.aclose()


def _priority(r: redis.Redis, key: str, job_id: str) -> int:
    score = r.zscore(key, job_id)
    assert score is not None, f"job {job_id} should wait in {key}"
    return 9 - int(score) // PRIORITY_SPAN


async def test_by_name_sets_priority_delay_key_and_queue(
    producer: drumbeat.App, app: drumbeat.App, r: redis.Redis
) -> None:
    ref = producer.task_ref("jobs.build", queue="builds")
    assert ref.task is None and ref.queue == "builds" and ref.priority == 0

    urgent = ref.options(priority=7).enqueue(1, priority="an argument")
    assert _priority(r, producer.keys.ready_of("builds"), urgent.id) == 7
    before = redis_now_ms(r)
    later = ref.options(delay=30, key="build-1").enqueue(2)
    due = r.zscore(producer.keys.due_of("builds"), later.id)
    assert due is not None and before + 30_000 <= due <= redis_now_ms(r) + 30_000
    again = ref.options(key="build-1").enqueue(3)
    assert again.duplicate and not again.created and again.id == later.id
    elsewhere = ref.options(queue="default").enqueue(4)
    assert r.zscore(producer.keys.ready, elsewhere.id) is not None

    # The sync calls above (the async ones: the next test). The worker's app knows the task:
    # the arguments reach it untouched by the options.
    @app.task(name="jobs.build", queue="builds")
    async def build(n: int, priority: str = "") -> str:
        return f"{n}:{priority}"

    async with running_worker(app, queues=["builds"]):
        assert await app.job(urgent.id).aresult(timeout=10) == "1:an argument"


async def test_by_name_async_and_in_enqueue_many(producer: drumbeat.App, r: redis.Redis) -> None:
    ref = producer.task_ref("jobs.report", queue="reports", priority=3)
    first = await ref.options(key="r-9", delay=60).aenqueue(9)
    dup = await ref.options(key="r-9").aenqueue(10)
    assert first.created and dup.duplicate and dup.id == first.id
    assert r.zscore(producer.keys.due_of("reports"), first.id) is not None
    plain = await ref.aenqueue(1)
    assert _priority(r, producer.keys.ready_of("reports"), plain.id) == 3, "the ref's default"
    batch = await producer.aenqueue_many(
        [ref.prepare(2), ref.options(priority=8).prepare(3), ref.options(key="r-9").prepare(4)]
    )
    ready = producer.keys.ready_of("reports")
    assert [_priority(r, ready, j.id) for j in batch[:2]] == [3, 8]
    assert batch[2].id == first.id and batch[2].duplicate


async def test_by_name_of_a_task_registered_here_keeps_its_defaults(
    app: drumbeat.App, r: redis.Redis
) -> None:
    @app.task(name="jobs.mail", queue="mail", priority=5, concurrency_limit=2)
    async def mail(to: str) -> None: ...

    ref = app.task_ref("jobs.mail")
    assert ref.task is mail and ref.queue == "mail" and ref.priority == 5
    job = await ref.options(concurrency_limit=1).aenqueue("a@example.com")
    assert _priority(r, app.keys.ready_of("mail"), job.id) == 5


def test_by_name_refuses_what_it_cannot_honour(producer: drumbeat.App) -> None:
    ref = producer.task_ref("jobs.unknown")
    with pytest.raises(TypeError, match="timeout"):
        ref.options(timeout=5)  # type: ignore[call-arg]
    with pytest.raises(drumbeat.InvalidJob, match="rate_limit by name needs task"):
        ref.options(rate_limit="1/s")
    with pytest.raises(drumbeat.InvalidJob, match="priority 12 is out of range"):
        ref.options(priority=12)
    with pytest.raises(drumbeat.InvalidJob, match="task name"):
        producer.task_ref("bad name")
    with pytest.raises(drumbeat.InvalidJob, match="queue name"):
        producer.task_ref("jobs.x", queue="no spaces")
