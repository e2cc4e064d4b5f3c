"""Limits on a real Redis Cluster: a worker's acquisitions go through the cluster client, sent
together in one pipeline (worker/limiting.py), and still take a permit in claim order."""

from __future__ import annotations

import itertools

import pytest

import drumbeat
from tests.conftest import running_worker
from tests.helpers import wait_for_async

pytestmark = pytest.mark.cluster


async def test_limited_jobs_acquire_in_claim_order_through_the_cluster_client(
    cluster_app: drumbeat.App,
) -> None:
    """Jobs of a concurrency-1 task claimed together take the permit one after another in
    enqueue order, and a rate-limited task's grants are an interval apart, on a cluster."""
    order: list[int] = []
    granted: list[int] = []

    @cluster_app.task(concurrency_limit=1)
    async def step(n: int) -> None:
        order.append(n)

    @cluster_app.task(rate_limit="50/s")
    async def tick() -> None:
        at = drumbeat.current_job().granted_ms
        assert at is not None, "a rate-limited run should know its grant"
        granted.append(at)

    await cluster_app.aenqueue_many([step.prepare(i) for i in range(8)])
    await cluster_app.aenqueue_many([tick.prepare() for _ in range(8)])
    async with running_worker(cluster_app, concurrency=8):
        await wait_for_async(lambda: len(order) + len(granted) == 16,
                             message="all 16 limited jobs should run", timeout=30)  # fmt: skip
    assert order == list(range(8)), f"a later job took the permit first: {order}"
    gaps = [b - a for a, b in itertools.pairwise(sorted(granted))]
    assert min(gaps) >= 20, f"grants closer than the 20 ms interval of 50/s: {gaps}"
