"""Workflows on a Redis Cluster: every key a workflow script touches is in its shard's slot,
so dependents are released in the shard of their dependencies, whichever master serves it."""

from __future__ import annotations

import uuid

import pytest

import drumbeat
from drumbeat.job_ids import job_shard_of
from tests.cluster.conftest import ClusterServer
from tests.conftest import running_worker

pytestmark = pytest.mark.cluster


async def test_dependents_run_after_their_dependencies_in_each_job_shard(
    redis_cluster: ClusterServer,
) -> None:
    ns = "c" + uuid.uuid4().hex[:12]
    app = drumbeat.App(redis_cluster.url, namespace=ns, job_shards=3, idle_block=0.5)
    order: list[str] = []

    @app.task
    async def step(name: str) -> str:
        order.append(name)
        return name

    try:
        joins = []
        for i in range(6):  # each enqueue call goes to the next shard's turn
            first, second = await app.aenqueue_many([step.prepare(f"a{i}"), step.prepare(f"b{i}")])
            joins.append(await step.options(depends_on=[first, second]).aenqueue(f"join{i}"))
            assert job_shard_of(joins[-1].id) == job_shard_of(first.id)
        chain = await app.achain([step.prepare("c1"), step.prepare("c2"), step.prepare("c3")])
        assert len({job_shard_of(j.id) for j in joins}) == 3
        with pytest.raises(drumbeat.InvalidJob, match="share a job shard"):
            others = [j for j in joins if job_shard_of(j.id) != job_shard_of(joins[0].id)]
            await step.options(depends_on=[joins[0], others[0]]).aenqueue("across")
        async with running_worker(app, concurrency=4):
            for job in [*joins, *chain]:
                await job.aresult(timeout=30)
        for i in range(6):
            assert order.index(f"join{i}") > max(order.index(f"a{i}"), order.index(f"b{i}"))
        assert [n for n in order if n.startswith("c")] == ["c1", "c2", "c3"]
    finally:
        await app.aclose()
