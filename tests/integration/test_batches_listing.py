"""The batches listing (`admin.list_batches`, `admin.batch_info`: `drumbeat batches ls | show`)
over the shard's `batchlist` index, against the session's redis-server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

import drumbeat
from drumbeat import admin
from drumbeat.testing import run_until_idle
from tests.conftest import reap_call


@pytest.fixture
def sync_app(redis_url: str, namespace: str) -> Iterator[drumbeat.App]:
    """An app with the tasks of ``tests.apps.cli_app`` that the batches use."""
    app = drumbeat.App(redis_url, namespace=namespace)
    app.task(name="add")(_add)
    app.task(name="boom", retries=0)(_boom)
    yield app
    app.close()


def _add(a: int, b: int = 0) -> int:
    return a + b


def _boom(message: str = "boom") -> None:
    raise RuntimeError(message)


def make_batches(app: drumbeat.App) -> tuple[drumbeat.Batch, drumbeat.Batch]:
    """An ended batch (one member failed) and, made after it, an open one with a pending
    member."""
    add, boom = app.tasks["add"], app.tasks["boom"]
    ended = app.batch(
        [add.prepare(1), boom.prepare("no")],
        on_complete=add.prepare(0), on_success=add.prepare(2),
    )  # fmt: skip
    run_until_idle(app)
    still_open = app.batch([add.prepare(3)], open=True)
    return ended, still_open


def test_batches_are_listed_newest_first_with_counts_and_callbacks(
    sync_app: drumbeat.App,
) -> None:
    assert admin.list_batches(sync_app) == []
    ended, still_open = make_batches(sync_app)
    newest, oldest = admin.list_batches(sync_app)
    assert (newest.id, oldest.id) == (still_open.id, ended.id)
    assert newest.status.state == "open" and not newest.status.ended
    assert dict(newest.status) == dict(still_open.status())
    assert oldest.status.ended and dict(oldest.status) == dict(ended.status())
    assert oldest.on_complete == ended.on_complete.id  # type: ignore[union-attr]
    assert oldest.on_success == ended.on_success.id  # type: ignore[union-attr]
    assert oldest.made_ms is not None and oldest.ended_ms is not None
    assert oldest.made_ms <= oldest.ended_ms
    assert [b.id for b in admin.list_batches(sync_app, 1)] == [still_open.id]
    info = admin.batch_info(sync_app, ended.id)
    assert info.failed_ids == (ended.jobs[1].id,)
    with pytest.raises(drumbeat.JobNotFound, match="f" * 32):
        admin.batch_info(sync_app, "f" * 32)


def test_a_batch_leaves_the_listing_when_it_is_forgotten(
    sync_app: drumbeat.App, r: redis.Redis
) -> None:
    ended, still_open = make_batches(sync_app)
    r.zadd(sync_app.keys.batchttl, {ended.id: 1})  # its time is up
    reap_call(sync_app).run(r)
    assert [b.id for b in admin.list_batches(sync_app)] == [still_open.id]
    assert r.zcard(sync_app.keys.batchlist) == 1


def test_batches_of_every_job_shard_are_listed(redis_url: str, namespace: str) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, job_shards=3)
    try:

        @app.task
        def work() -> None: ...

        batches = [app.batch([work.prepare()]) for _ in range(4)]
        assert {b.id for b in admin.list_batches(app)} == {b.id for b in batches}
        assert len({app.job_shard(b.id)[0].tag for b in batches}) > 1
    finally:
        app.close()
