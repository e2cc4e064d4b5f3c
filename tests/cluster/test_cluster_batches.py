"""Batches on a Redis Cluster: a batch, its members and its callbacks live in one job shard (its
slot), whichever master serves it; every key its scripts touch is passed in KEYS."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis

import drumbeat
from drumbeat.job_ids import job_shard_of
from drumbeat.testing import run_until_idle
from tests.cluster.conftest import ClusterServer
from tests.conftest import running_worker

REDIS_PY_8 = tuple(int(part) for part in redis.__version__.split(".")[:2]) >= (8, 0)
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        not REDIS_PY_8,
        reason=f"redis-py {redis.__version__} sends no MULTI to a Redis Cluster, which a batch's "
        "write is (upgrade to redis>=8.0 for batches on a cluster; docs/workflows.md)",
    ),
]


async def test_batches_end_with_their_callbacks_in_each_job_shard(
    redis_cluster: ClusterServer,
) -> None:
    ns = "c" + uuid.uuid4().hex[:12]
    app = drumbeat.App(redis_cluster.url, namespace=ns, job_shards=3, idle_block=0.5)
    ran: list[str] = []

    @app.task
    async def step(name: str) -> str:
        ran.append(name)
        return name

    try:
        batches = [
            await app.abatch(
                [step.prepare(f"{i}.{j}") for j in range(5)], on_complete=step.prepare(f"cb{i}")
            )
            for i in range(6)  # each batch goes to the next shard's turn
        ]
        assert len({job_shard_of(b.id) for b in batches}) == 3
        for b in batches:
            assert b.on_complete is not None
            shards = {job_shard_of(j.id) for j in [*b.jobs, b.on_complete]}
            assert shards == {job_shard_of(b.id)}
        async with running_worker(app, concurrency=4):
            done = await asyncio.gather(*(b.await_done(timeout=30) for b in batches))
            for b in batches:
                assert b.on_complete is not None
                await b.on_complete.aresult(timeout=30)
        assert [s.succeeded for s in done] == [5] * 6
        for i in range(6):
            assert ran.index(f"cb{i}") > max(ran.index(f"{i}.{j}") for j in range(5))
    finally:
        await app.aclose()


def test_a_batch_from_the_sync_client_on_a_cluster(redis_cluster: ClusterServer) -> None:
    ns = "c" + uuid.uuid4().hex[:12]
    app = drumbeat.App(redis_cluster.url, namespace=ns, job_shards=2, idle_block=0.5)

    @app.task
    def step(name: str) -> str:
        return name

    try:
        batch = app.batch([step.prepare(str(i)) for i in range(4)], on_complete=step.prepare("cb"))
        batch.add([step.prepare("late")])
        with pytest.raises(drumbeat.ResultTimeout):
            batch.wait(timeout=0.2)
        run_until_idle(app)
        assert batch.wait(timeout=10).succeeded == 5
        assert batch.on_complete is not None and batch.on_complete.result(timeout=10) == "cb"
    finally:
        app.close()
