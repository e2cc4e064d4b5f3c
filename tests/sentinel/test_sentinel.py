"""drumbeat through Redis Sentinel (a master, a replica, three sentinels): jobs and schedules on a
``redis+sentinel://`` URL, and a worker that follows a failover after the master is killed."""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

import drumbeat
from drumbeat import connections, sentinel
from tests.conftest import RedisServer, _free_port, running_worker, server_binary
from tests.ha_process import check_processes_on
from tests.helpers import wait_for_async
from tests.sentinel.conftest import SentinelSetup


def test_sentinel_url_names_its_sentinels_service_and_options() -> None:
    parsed = sentinel.parse(
        "redis+sentinel://u%40x:p%3As@10.0.0.1:26379,[::1]:26380/my%20master/2"
        "?socket_timeout=2.5&sentinel_password=sp"
    )
    assert parsed.sentinels == [("10.0.0.1", 26379), ("::1", 26380)]
    assert parsed.service == "my master"
    assert parsed.options == {"username": "u@x", "password": "p:s", "db": 2, "socket_timeout": 2.5}
    assert parsed.sentinel_options == {"password": "sp"}
    assert sentinel.parse("redis+sentinel://h:1/m?db=3").options == {"db": 3}
    assert sentinel.is_sentinel("REDIS+SENTINEL://h:1/m")
    assert not sentinel.is_sentinel("redis://h:1/0")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis+sentinel:///mymaster", "names no sentinel"),
        ("redis+sentinel://h:26379,h/mymaster", "expected host:port"),
        ("redis+sentinel://h:26379", "names no service"),
        ("redis+sentinel://h:26379/", "names no service"),
        ("redis+sentinel://h:26379/mymaster/x", "expected one database number"),
        ("redis+sentinel://h:26379/mymaster/1?db=2", "expected one database number"),
        ("redis+sentinel://h:26379/mymaster?socket_timeout=soon", "socket_timeout"),
    ],
)
def test_bad_sentinel_urls_say_what_was_expected(url: str, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        connections.sync_client(url)


def test_every_client_reaches_the_master_through_the_sentinels(
    redis_sentinel: SentinelSetup,
) -> None:
    url = redis_sentinel.url + "?socket_timeout=3"
    made = [connections.sync_client(url), connections.blocking_client(url),
            connections.heartbeat_client(redis_sentinel.url)]  # fmt: skip
    try:
        for client in made:
            assert client.set("drumbeat-sentinel-probe", "1")
            assert client.connection_pool.get_master_address() == (  # type: ignore[attr-defined]
                "127.0.0.1", redis_sentinel.master_port(),
            )  # fmt: skip
        # The URL's read timeout, except where a blocking command needs a longer one; the
        # sentinels are asked with a short one whatever the client's.
        read_timeouts = [c.connection_pool.connection_kwargs["socket_timeout"] for c in made]
        assert read_timeouts == [
            3.0, connections.MAX_BLOCK + connections.BLOCK_MARGIN, connections.HEARTBEAT_TIMEOUT
        ]  # fmt: skip
        for client in made:
            for watcher in client.manager.sentinels:  # type: ignore[attr-defined]
                assert watcher.connection_pool.connection_kwargs["socket_timeout"] <= 5
    finally:
        for client in made:
            client.close()


async def test_concurrent_connects_keep_every_sentinel_once(redis_sentinel: SentinelSetup) -> None:
    """redis-py moves the sentinel that answered to the front of its list by index, and the
    index goes stale while another connect's lookup awaits: lookups at once (a worker's
    connections reconnecting after a failover) could list one sentinel twice and lose another,
    whose connections were then never closed. The first sentinel named here is down, so every
    lookup moves the second one forward."""
    dead = _free_port()
    url = redis_sentinel.url.replace("://", f"://127.0.0.1:{dead},", 1)
    sync_made = connections.sync_client(url)
    made = connections.async_client(url)
    try:
        everyone = {id(s) for s in made.manager.sentinels}  # type: ignore[attr-defined]
        await asyncio.gather(*(made.ping() for _ in range(10)))  # 10 connections, 10 lookups
        listed = [id(s) for s in made.manager.sentinels]  # type: ignore[attr-defined]
        assert sorted(listed) == sorted(everyone), "each sentinel is listed once"
        sync_everyone = {id(s) for s in sync_made.manager.sentinels}  # type: ignore[attr-defined]
        with ThreadPoolExecutor(10) as pool:
            list(pool.map(lambda _: sync_made.connection_pool.get_master_address(), range(200)))  # type: ignore[attr-defined]
        listed = [id(s) for s in sync_made.manager.sentinels]  # type: ignore[attr-defined]
        assert sorted(listed) == sorted(sync_everyone), "each sentinel is listed once (threads)"
    finally:
        await made.aclose()
        sync_made.close()


async def test_a_job_and_a_schedule_run_through_a_sentinel_url(
    sentinel_app: drumbeat.App, redis_sentinel: SentinelSetup
) -> None:
    ticks: list[int] = []

    @sentinel_app.task
    def double(n: int) -> int:
        return n * 2

    @sentinel_app.task
    def tick() -> None:
        ticks.append(1)

    job = double.enqueue(21)  # the producer's own connection (`Direct`) through the sentinels
    direct = sentinel_app.connections.direct
    assert isinstance(direct, connections.Direct) and direct._local.held is not None
    ajob = await double.aenqueue(4)
    sentinel_app.schedule("tick", tick, every=1)
    async with running_worker(sentinel_app, concurrency=2):
        assert await job.aresult(timeout=20) == 42
        assert await ajob.aresult(timeout=20) == 8
        await wait_for_async(
            lambda: len(ticks), lambda n: n >= 2, message="the schedule ran twice", timeout=30
        )
    assert job.status() == "complete"
    # It all went to the master the sentinels name.
    master = redis_sentinel.node(redis_sentinel.master_port())
    with master.client() as client:
        assert list(client.scan_iter(match=f"drumbeat:{{{sentinel_app.settings.namespace}}}*"))


def _enqueue_through_failover(app: drumbeat.App, task: drumbeat.Task[Any, Any], n: int) -> Any:
    """Enqueues, retrying while the sentinels have no master to name yet."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return task.enqueue(n)
        except redis.RedisError as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"enqueue still failing 30 s after the kill: {exc!r}") from exc
            time.sleep(0.2)


@pytest.mark.slow
async def test_a_worker_carries_on_after_the_master_is_killed(
    redis_sentinel: SentinelSetup, own_sentinel: SentinelSetup
) -> None:
    await carries_on_after_the_master_is_killed(own_sentinel)


async def carries_on_after_the_master_is_killed(setup: SentinelSetup) -> None:
    """kill -9 of the master; the sentinels promote the replica; a running worker runs and
    settles the jobs enqueued after the failover, on the new master."""
    app = drumbeat.App(setup.url, namespace="s" + uuid.uuid4().hex[:12])
    ran: set[int] = set()

    @app.task
    def note(n: int) -> None:
        ran.add(n)

    try:
        async with running_worker(app, concurrency=2):
            for n in range(5):
                note.enqueue(n)
            await wait_for_async(lambda: len(ran), lambda k: k == 5, message="5 jobs ran")
            old = setup.master_port()
            setup.node(old).kill()
            await wait_for_async(
                lambda: asyncio.to_thread(setup.master_port),
                lambda port: port != old,
                message=f"the sentinels should promote the replica after the master on {old} died",
                timeout=60,
            )
            late = [await asyncio.to_thread(_enqueue_through_failover, app, note, n)
                    for n in range(5, 10)]  # fmt: skip
            await wait_for_async(
                lambda: sorted(ran), lambda seen: set(range(5, 10)) <= set(seen),
                message="the worker should run the jobs enqueued after the failover",
                timeout=40,
            )  # fmt: skip
            await wait_for_async(
                lambda: asyncio.to_thread(lambda: [j.status() for j in late]),
                lambda s: s == ["complete"] * 5,
                message="the worker should settle the jobs on the new master",
            )  # fmt: skip
        new = setup.node(setup.master_port())
        assert new.port != old
        with new.client() as client:
            keys = list(client.scan_iter(match=f"drumbeat:{{{app.settings.namespace}}}*"))
        assert keys, "the jobs enqueued after the failover went to the new master"
    finally:
        await app.aclose()


@pytest.mark.slow
async def test_a_worker_follows_a_failover_that_keeps_the_old_master_as_a_replica(
    redis_sentinel: SentinelSetup, own_sentinel: SentinelSetup
) -> None:
    """``SENTINEL FAILOVER``: the old master stays up, made a replica. A connection that
    reconnected to its last address would now reach a replica, whose READONLY refuses every
    claim and settle; each must ask the sentinels again."""
    app = drumbeat.App(own_sentinel.url, namespace="s" + uuid.uuid4().hex[:12])
    ran: set[int] = set()

    @app.task
    def note(n: int) -> None:
        ran.add(n)

    try:
        async with running_worker(app, concurrency=2):
            note.enqueue(0)
            await wait_for_async(lambda: len(ran), lambda k: k == 1, message="a job ran")
            old = own_sentinel.master_port()
            with own_sentinel.sentinels[0].client() as watcher:
                watcher.execute_command("SENTINEL", "FAILOVER", "mymaster")
            await wait_for_async(
                lambda: asyncio.to_thread(own_sentinel.master_port),
                lambda port: port != old,
                message=f"the sentinels should make the replica the master instead of {old}",
                timeout=60,
            )
            for n in range(1, 6):
                await asyncio.to_thread(_enqueue_through_failover, app, note, n)
            await wait_for_async(
                lambda: sorted(ran), lambda seen: set(range(1, 6)) <= set(seen),
                message="the worker should run the jobs enqueued after the failover",
                timeout=40,
            )  # fmt: skip
    finally:
        await app.aclose()


def test_a_producer_connection_to_a_demoted_master_is_dropped() -> None:
    """A master made a replica keeps its clients but answers writes with READONLY: the
    producer's own connection (`Direct`) must be dropped, as redis-py's sentinel-managed
    connections drop theirs, so the next one asks the sentinels where the master went."""
    old, new = RedisServer(server_binary()), RedisServer(server_binary())
    old.start()
    new.start()
    client = connections.sync_client(old.url)
    direct = connections.Direct(client)
    try:
        assert direct.execute("SET", "drumbeat-demoted", "1") == b"OK"
        with redis.Redis.from_url(old.url) as admin:
            admin.replicaof("127.0.0.1", new.port)
        with pytest.raises(redis.ConnectionError, match="now a replica"):
            direct.execute("SET", "drumbeat-demoted", "2")
        assert direct._local.held is None, "the connection to the replica should be dropped"
    finally:
        direct.close()
        client.close()
        old.stop()
        new.stop()


@pytest.mark.process
def test_a_supervisor_and_the_cli_work_through_a_sentinel_url(
    redis_sentinel: SentinelSetup,
) -> None:
    check_processes_on(redis_sentinel.url)
