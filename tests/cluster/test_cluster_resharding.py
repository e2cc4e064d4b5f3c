"""The worker's routing (`worker.routing`) while a shard's slot migrates to another master, as
``redis-cli --cluster reshard`` moves it: marked importing and migrating, its keys moved with
``MIGRATE``, then given away. The old owner answers ASK for a call whose keys are not all there;
the worker follows it (``ASKING``, then the call, on the importing master) without touching its
slot map, and once the slot is given away the old owner's MOVED updates the map."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import redis

import drumbeat
from drumbeat import connections
from drumbeat.worker.retrying import is_transient
from drumbeat.worker.routing import Nodes, Routed
from tests.cluster.conftest import ClusterServer, Node
from tests.cluster.test_cluster_direct import _asking, _masters, _node_id
from tests.conftest import running_worker
from tests.helpers import wait_for_async

pytestmark = pytest.mark.cluster

_F = TypeVar("_F", bound=Callable[..., Any])

WORKER = "w-resharding"
LEASE_MS = 60_000

# redis-py before 8.0 (5.1.0, 6.4.0 and 7.4.1 tried) replaces its cluster nodes when a finished
# migration refreshes its slot map and disconnects the old ones in tasks it never awaits: a call
# in flight on one fails ("Connection closed by server"), and sockets of replaced nodes outlive
# the client (ResourceWarning). In 6 runs of the test below each, 5.1.0 and 6.4.0 showed one or
# the other in 2, 7.4.1 in 6, 8.0.0 in none (redis/redis-py#3572, #4053).
REDIS_PY_8 = tuple(int(part) for part in redis.__version__.split(".")[:2]) >= (8, 0)


def _leaks_before_redis_py_8(test: _F) -> _F:
    """A test whose worker sees a migration end: with redis-py before 8.0, the sockets that
    redis-py leaks then are not drumbeat's to close (ResourceWarnings when collected)."""
    if REDIS_PY_8:
        return test
    for ignored in ("ResourceWarning", "pytest.PytestUnraisableExceptionWarning"):
        test = pytest.mark.filterwarnings(f"ignore::{ignored}")(test)
    return test


def _jobs_slot(cluster: ClusterServer, app: drumbeat.App) -> tuple[list[Node], Node, Node, int]:
    """The masters, the master holding the app's jobs shard, another master to move it to, and
    the shard's slot."""
    masters = _masters(cluster)
    source = cluster.node_of(app.keys.ready)
    target = next(node for node in masters if node is not source)
    with cluster.client() as client:
        return masters, source, target, client.keyslot(app.keys.ready)


def _migrate(source: Node, target: Node, slot: int) -> None:
    """Starts moving ``slot`` from ``source`` to ``target`` and moves every key it holds."""
    with target.client() as client:
        client.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _node_id(source))
    with source.client() as client:
        client.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _node_id(target))
        keys = client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
        assert keys, f"slot {slot} holds the shard's keys"
        client.migrate("127.0.0.1", target.port, keys, 0, 5000)


def _give_away(masters: list[Node], slot: int, target: Node) -> None:
    """Ends the migration: ``slot`` is ``target``'s (told first: it bumps its config epoch, so
    the rest of the cluster takes its word)."""
    for node in sorted(masters, key=lambda n: n is not target):
        with node.client() as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", _node_id(target))


async def test_a_claim_during_a_slot_migration_follows_ask_to_the_importing_master(
    redis_cluster: ClusterServer,
) -> None:
    """Redis runs a call of several keys on the importing master only if every key is there
    already, so the shard is first given each key a claim names, as a busy shard has them: a
    schedule that ran (its lateness), queued and delayed jobs, a claimed job that saved its
    progress. The claim sent during the migration then takes the next job through ASK, where
    before it failed until the migration ended. Its ack names keys that exist only when needed
    (the job's `done` list, results): the importing master answers TRYAGAIN, a transient error
    the settler waits out, and after the migration the ack lands on the new master."""
    app = drumbeat.App(redis_cluster.url, namespace="r" + uuid.uuid4().hex[:12])
    ticks: list[int] = []

    @app.task
    def tick() -> None:
        ticks.append(1)

    @app.task
    def job(n: int) -> None: ...

    scripts = app.scripts
    masters, source, target, slot = _jobs_slot(redis_cluster, app)
    client = connections.worker_client(redis_cluster.url, 1.0)
    nodes = Nodes(redis_cluster.url, client, 5.0)
    routed = Routed(nodes)
    try:
        app.schedule("tick", tick, every=1)
        async with running_worker(app, concurrency=1):
            await wait_for_async(lambda: len(ticks), lambda n: n >= 1, message="a run of tick")
        first, second = job.enqueue(1), job.enqueue(2)
        job.options(delay=3600).enqueue(3)
        (taken,) = await routed.run([scripts.claim(WORKER, 1, LEASE_MS, 100)])
        assert [j.id for j in taken.jobs] == [first.id]
        await routed.run([scripts.save_progress(first.id, taken.jobs[0].token, b"half")])
        app.pause_queue("idle")  # a queue nothing uses: the claim's `pauses` set exists
        claim = scripts.claim(WORKER, 1, LEASE_MS, 100)
        with source.client() as admin:
            missing = [key for key in claim.keys if not admin.exists(key)]
        assert not missing, f"the test means every key of the claim to exist: {missing}"
        with target.client() as admin:  # the importing master has not seen the scripts
            admin.script_flush()
        asked = _asking(target)

        _migrate(source, target, slot)
        try:
            (during,) = await routed.run([claim])
            assert [j.id for j in during.jobs] == [second.id], "the claim took the next job"
            assert _asking(target) > asked, "the claim went to the importing master"
            assert not nodes.stale, "an ASK leaves the slot map as it is"
            assert await nodes.address_of(app.keys.ready) == ("127.0.0.1", source.port)
            token = during.jobs[0].token
            ack = scripts.complete([(second.id, token, b"null", 0, during.jobs[0].extra)])
            with pytest.raises(redis.exceptions.TryAgainError) as refused:
                await routed.run([ack])
            assert is_transient(refused.value), "the settler sends the ack again later"
        finally:
            _give_away(masters, slot, target)

        deadline = time.monotonic() + 30
        while True:  # as the settler does: send again after a transient error
            try:
                assert await routed.run([ack]) == [[1]], "the ack was accepted"
                break
            except redis.RedisError as exc:
                assert is_transient(exc), f"the ack after the migration failed: {exc!r}"
                assert time.monotonic() < deadline, f"the ack still fails 30 s on: {exc!r}"
                await asyncio.sleep(0.1)
        assert await nodes.address_of(app.keys.ready) == ("127.0.0.1", target.port)
        with target.client() as admin:  # the ack ran on the new master, where the jobs went
            assert admin.hmget(app.keys.jobs, [first.id, second.id])[1] is None
        assert first.status() == "running"
    finally:
        await routed.aclose()
        await nodes.aclose()
        await client.aclose()
        await app.aclose()


@_leaks_before_redis_py_8
async def test_a_worker_tries_its_calls_again_through_a_migration_without_backing_off(
    redis_cluster: ClusterServer, caplog: pytest.LogCaptureFixture
) -> None:
    """An idle shard's claim can run on neither master while its slot migrates: it names keys
    that exist nowhere (an empty `ready`, `wake`), and Redis answers TRYAGAIN, or ASK for the
    idle wait's pop. The claim loop used to take that for a failure: a warning each time and a
    pause doubling up to 5 s, so a worker could start nothing for 5 s after the migration
    ended. It now tries again every `retrying.MIGRATION_RETRY` s (as does the settler with
    its acks), says so at info level, and goes on at once when the slot has moved."""
    app = drumbeat.App(redis_cluster.url, namespace="r" + uuid.uuid4().hex[:12], idle_block=0.5)
    ran: list[int] = []

    @app.task
    def job(n: int) -> None:
        ran.append(n)

    masters, source, target, slot = _jobs_slot(redis_cluster, app)
    try:
        async with running_worker(app, concurrency=1):
            job.enqueue(1)
            await wait_for_async(lambda: list(ran), lambda r: r == [1], message="the first job")
            caplog.set_level(logging.INFO, logger="drumbeat.worker")
            caplog.clear()
            _migrate(source, target, slot)
            try:
                # Several idle waits (0.5 s each) and claims while the slot migrates.
                await wait_for_async(
                    lambda: [r.getMessage() for r in caplog.records],
                    lambda seen: any("claiming: a slot is migrating" in m for m in seen),
                    message="the claim loop meeting the migration",
                )
                await asyncio.sleep(1.5)
            finally:
                _give_away(masters, slot, target)
            job.enqueue(2)
            await wait_for_async(lambda: list(ran), lambda r: r == [1, 2], message="a job after")
        messages = [r.getMessage() for r in caplog.records]
        backed_off = [m for m in messages if "failed (TryAgain" in m or "failed (AskError" in m]
        assert not backed_off, "a part of the worker backed off through the migration"
        assert any("slot is migrating" in m for m in messages), "it said why it tries again"
    finally:
        await app.aclose()
        # The records' tracebacks would keep what they name alive past this test's collection
        # of garbage (`tests.conftest._collect_garbage`), and a leak would surface in another.
        caplog.clear()


@pytest.mark.skipif(
    not REDIS_PY_8,
    reason=f"redis-py {redis.__version__} drops calls in flight and leaks sockets when a "
    "migration ends (upgrade to redis>=8.0 for clusters that are resharded; docs/deploy.md)",
)
async def test_leases_that_lapse_during_a_migration_are_renewed_before_they_are_taken_over(
    redis_cluster: ClusterServer, caplog: pytest.LogCaptureFixture
) -> None:
    """While a shard's slot migrates, neither the heartbeat's renewal nor housekeeping's reap
    can run on it (each names a key that exists on neither master), so a migration longer than
    a lease lets a running job's lease expire. When it ended, the first reap took the job over
    and it ran twice, and both parts had backed off as on a failure (redis-py's cluster client
    gives up with "TTL exhausted"). Now both try again every 0.1 s, and the reap leaves the
    shard's expired leases alone for a heartbeat after the migration, so the heartbeat renews
    the job's lease first and it runs once."""
    app = drumbeat.App(
        redis_cluster.url, namespace="r" + uuid.uuid4().hex[:12], idle_block=0.5, lease=1.5,
        maintenance_interval=0.2,
    )  # fmt: skip
    starts: list[int] = []
    release = asyncio.Event()

    @app.task
    async def job(n: int) -> None:
        starts.append(n)
        await release.wait()

    masters, source, target, slot = _jobs_slot(redis_cluster, app)
    try:
        async with running_worker(app, concurrency=2) as worker:
            handle = job.enqueue(1)
            await wait_for_async(lambda: list(starts), lambda s: s == [1], message="the job")
            caplog.set_level(logging.INFO, logger="drumbeat.worker")
            caplog.clear()
            _migrate(source, target, slot)
            try:
                await asyncio.sleep(3.0)  # twice the lease
            finally:
                _give_away(masters, slot, target)
            await asyncio.sleep(3.0)  # housekeeping reaps every 0.2 s meanwhile
            assert starts == [1], "the job was taken over after the migration"
            release.set()
            await wait_for_async(lambda: worker.table.running, lambda n: n == 0,
                                 message="the job to end")  # fmt: skip
        assert await handle.aresult(timeout=10) is None
        assert starts == [1]
        messages = [r.getMessage() for r in caplog.records]
        failed = [m for m in messages if " failed (" in m]
        assert not failed, f"a part of the worker backed off through the migration: {failed}"
        renewal = [m for m in messages if m.startswith("lease renewal: a slot is migrating")]
        assert renewal, f"the heartbeat met the migration: {messages}"
        assert not [m for m in messages if "expired leases" in m], messages
    finally:
        await app.aclose()
