"""A Redis Cluster that cannot be reached for a while: the worker waits it out, as it does an
outage of a single Redis, instead of counting the cluster client's errors as crashes."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
import redis

import drumbeat
from drumbeat.worker.retrying import CRASH_LIMIT, is_transient
from tests.cluster.conftest import ClusterServer, _pings, _poll, _state_ok
from tests.cluster.test_cluster import _enqueue_through_failover
from tests.helpers import wait_for_async

pytestmark = pytest.mark.cluster

UNREACHABLE = "Redis Cluster cannot be connected"


def _mentions(record: logging.LogRecord, text: str) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return text in record.getMessage() or (error is not None and text in str(error))


def test_the_cluster_clients_errors_for_an_unreachable_cluster_are_transient() -> None:
    refused = redis.ConnectionError("Error 111 connecting to 127.0.0.1:7000. Connection refused.")
    try:
        raise redis.exceptions.RedisClusterException(f"{UNREACHABLE}: {refused}") from refused
    except redis.exceptions.RedisClusterException as exc:
        assert is_transient(exc)
    uncovered = "All slots are not covered after query all startup_nodes. 10923 of 16384 covered"
    assert is_transient(redis.exceptions.RedisClusterException(uncovered))
    # A refusal stays a refusal: retrying a cross-slot command changes nothing.
    cross = "EVALSHA - all keys must map to the same key slot"
    assert not is_transient(redis.exceptions.RedisClusterException(cross))


def test_an_autoscaler_keeps_its_pool_while_the_cluster_cannot_be_reached(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It logs one warning and keeps the pool as it is, as on a single Redis that is down
    (before, the cluster client's error escaped: a traceback on every look)."""
    from drumbeat.autoscale import Autoscaler
    from tests.conftest import _free_port

    app = drumbeat.App(f"redis+cluster://127.0.0.1:{_free_port()}", namespace="unreachable")
    scaler = Autoscaler(app, minimum=1, maximum=4, concurrency=2)
    try:
        assert scaler.look(live=3, desired=3, retiring=0, now=0.0) == scaler.policy.desired
    finally:
        scaler.close()
        app.close()
    assert [r.getMessage()[:40] for r in caplog.records] == [
        "autoscaling: cannot read Redis (RedisClu"
    ]


@pytest.mark.slow
async def test_a_worker_rides_out_every_node_of_its_cluster_down(
    own_cluster: ClusterServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Every node killed at once, so each connection is refused: redis-py's cluster client then
        raises a bare ``RedisClusterException`` ("Redis Cluster cannot be connected"), which is no
        `RedisError`. Once the nodes are back the worker runs what is enqueued, never having given
        up (a part that crashes `CRASH_LIMIT` times in a minute stops the worker: the claim loop's
    restarts take under 2 s, so it meets the error that often well before ours are counted)."""
    caplog.set_level(logging.WARNING, logger="drumbeat")
    # A short lease: the heartbeat (every lease/3) meets the outage often too.
    app = drumbeat.App(own_cluster.url, namespace="c" + uuid.uuid4().hex[:12], lease=3.0)
    ran: set[int] = set()

    @app.task
    def note(n: int) -> None:
        ran.add(n)

    worker = drumbeat.Worker(app, concurrency=2)
    running = asyncio.create_task(worker.run())
    try:
        for n in range(3):
            await note.aenqueue(n)
        await wait_for_async(lambda: len(ran), lambda k: k == 3, message="3 jobs ran first")

        for node in own_cluster.nodes:
            node.kill()
        await wait_for_async(
            lambda: (
                running.done()
                or sum(_mentions(r, UNREACHABLE) for r in caplog.records) >= 3 * CRASH_LIMIT
            ),
            message=f"the worker should meet {UNREACHABLE!r} {3 * CRASH_LIMIT} times (its "
            "claim loop alone would have crashed out)",
            timeout=40,
        )
        assert not running.done(), f"the worker gave up: {running.exception()!r}"
        crashed = [r.getMessage() for r in caplog.records if "crashed" in r.getMessage()]
        assert crashed == [], "an unreachable cluster is an outage, not a crash of a part"

        for node in own_cluster.nodes:
            node.start()
        for node in own_cluster.nodes:
            await asyncio.to_thread(_poll, lambda n=node: _pings(n), f"{node.address} restarted")
            await asyncio.to_thread(_poll, lambda n=node: _state_ok(n), f"{node.address} ok")
        await asyncio.to_thread(_enqueue_through_failover, app, note, 10)
        await wait_for_async(
            lambda: 10 in ran, message="the worker should run a job enqueued once the cluster is "
            "back", timeout=30,
        )  # fmt: skip
        assert not running.done(), "the worker is still running"
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
        await app.aclose()
