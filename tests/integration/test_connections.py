"""Clients and their timeouts: waits longer than a client's read timeout, on every redis-py."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
import redis.asyncio as redis_async

import drumbeat
from drumbeat import connections
from drumbeat.script_sources import SOURCES
from tests.conftest import RedisServer, running_worker
from tests.helpers import entries, wait_for

# redis-py 8 gives up on a reply after 5 s unless told otherwise; these waits outlast that.
LONGER_THAN_DEFAULT = 7.0


@pytest.mark.slow
async def test_result_waits_past_redis_py_default_read_timeout(app: drumbeat.App) -> None:
    @app.task
    async def late() -> str:
        await asyncio.sleep(LONGER_THAN_DEFAULT)
        return "late but here"

    @app.task
    def never_run() -> None: ...

    finishes = await late.aenqueue()
    never = await never_run.options(delay=3600).aenqueue()
    started = time.monotonic()
    async with running_worker(app):
        # All four waits at once: the sync ones in threads, the async ones on this loop.
        outcomes = await asyncio.gather(
            asyncio.to_thread(finishes.result, timeout=30),
            finishes.aresult(timeout=30),
            asyncio.to_thread(never.result, timeout=LONGER_THAN_DEFAULT),
            never.aresult(timeout=LONGER_THAN_DEFAULT),
            return_exceptions=True,
        )
    assert time.monotonic() - started >= LONGER_THAN_DEFAULT, "the job ran early: proves nothing"
    assert outcomes[:2] == ["late but here", "late but here"], (
        f"result() and aresult() of a job finishing after {LONGER_THAN_DEFAULT} s gave "
        f"{outcomes[:2]!r}, expected its value twice"
    )
    for waited, outcome in zip(("result", "aresult"), outcomes[2:], strict=True):
        assert isinstance(outcome, drumbeat.ResultTimeout), (
            f"{waited}(timeout={LONGER_THAN_DEFAULT}) of a job that never finishes raised "
            f"{outcome!r}, expected drumbeat.ResultTimeout"
        )


@pytest.fixture
async def short_read_app(redis_url: str, namespace: str) -> AsyncIterator[drumbeat.App]:
    """An App whose URL asks for a 1 s read timeout, shorter than the waits below."""
    app = drumbeat.App(f"{redis_url}?socket_timeout=1", namespace=namespace)
    yield app
    await app.aclose()


async def test_blocking_waits_outlast_a_read_timeout_given_in_the_url(
    short_read_app: drumbeat.App,
) -> None:
    app = short_read_app

    @app.task
    def never_run() -> None: ...

    job = await never_run.aenqueue()  # and no worker
    wait = 2.5
    outcomes = await asyncio.gather(
        asyncio.to_thread(job.result, timeout=wait),
        job.aresult(timeout=wait),
        return_exceptions=True,
    )
    for waited, outcome in zip(("result", "aresult"), outcomes, strict=True):
        assert isinstance(outcome, drumbeat.ResultTimeout), (
            f"{waited}(timeout={wait}) with ?socket_timeout=1 in the URL raised {outcome!r}, "
            "expected drumbeat.ResultTimeout: the wait must not run on a 1 s read timeout"
        )
    # Ordinary commands keep the URL's read timeout.
    assert app.redis.connection_pool.connection_kwargs["socket_timeout"] == 1.0


async def test_every_client_sets_its_timeouts_and_blocking_ones_outlast_their_block(
    short_read_app: drumbeat.App,
) -> None:
    app = short_read_app
    idle_block = app.settings.idle_block
    worker = connections.worker_client(app.url, idle_block)
    heartbeat = connections.heartbeat_client(app.url)
    plain = drumbeat.App(app.url.partition("?")[0], namespace=app.keys.namespace)
    clients: dict[str, redis.Redis | redis_async.Redis] = {
        "App.redis": plain.redis,
        "App.aredis()": await plain.aredis(),
        "Connections.blocking": app.connections.blocking,
        "Connections.ablocking()": await app.connections.ablocking(),
        "worker_client": worker,
        "heartbeat_client": heartbeat,
    }
    try:
        timeouts = {}
        for name, client in clients.items():
            options = client.connection_pool.connection_kwargs
            for option in ("socket_connect_timeout", "socket_timeout"):
                assert options.get(option) is not None, (
                    f"{name} leaves {option} to redis-py's default, expected an explicit value"
                )
            timeouts[name] = options["socket_timeout"]
        for name in ("Connections.blocking", "Connections.ablocking()"):
            assert timeouts[name] > connections.MAX_BLOCK, f"{name}'s reads end before its block"
        assert timeouts["worker_client"] > idle_block, "the worker's idle wait would time out"
        assert timeouts["App.redis"] == timeouts["App.aredis()"] == connections.COMMAND_TIMEOUT
    finally:
        await worker.aclose()
        heartbeat.close()
        await plain.aclose()


# -- the producer's own connection per thread (connections.Direct) -------------------------------


def _direct_ids(r: redis.Redis) -> set[int]:
    """Ids of the connections whose last command was an EVALSHA: the producers' own."""
    return {int(c["id"]) for c in r.client_list() if c.get("cmd") == "evalsha"}


async def test_each_producer_thread_enqueues_on_a_connection_of_its_own(
    own_app: drumbeat.App, own_r: redis.Redis
) -> None:
    @own_app.task
    def work(i: int) -> None: ...

    per_thread, threads = 200, 4
    barrier = threading.Barrier(threads)
    own_r.script_load(SOURCES["enqueue"])  # else a NOSCRIPT sends a first call via the client

    def produce(t: int) -> set[str]:
        barrier.wait()  # all at once, so a shared connection would interleave their replies
        return {work.enqueue(t * per_thread + i).id for i in range(per_thread)}

    with ThreadPoolExecutor(threads) as pool:
        ids = set().union(*pool.map(produce, range(threads)))
        assert len(_direct_ids(own_r)) == threads, (
            f"{threads} producer threads should each hold one connection; CLIENT LIST shows "
            f"{own_r.client_list()}"
        )
        own_app.close()  # while the threads still live (their ends would close them too)
        wait_for(lambda: _direct_ids(own_r), lambda ids: not ids,
                 message="closing the app should close every thread's connection")  # fmt: skip
    assert len(ids) == threads * per_thread, "every enqueue should return a job of its own"
    assert entries(own_r, own_app.keys.jobs) == threads * per_thread


async def test_a_producer_thread_that_ends_closes_its_connection_without_the_collector(
    own_app: drumbeat.App, own_r: redis.Redis
) -> None:
    @own_app.task
    def work() -> None: ...

    own_r.script_load(SOURCES["enqueue"])
    gc.disable()  # a connection left to the collector stays open (or warns when collected)
    try:
        thread = threading.Thread(target=work.enqueue)
        thread.start()
        thread.join()
        wait_for(lambda: _direct_ids(own_r), lambda ids: not ids,
                 message="a thread's own connection should close when the thread ends")  # fmt: skip
    finally:
        gc.enable()
    assert entries(own_r, own_app.keys.jobs) == 1


async def test_a_killed_producer_connection_costs_no_enqueue(
    own_app: drumbeat.App, own_r: redis.Redis
) -> None:
    @own_app.task
    def work() -> None: ...

    work.enqueue()
    (killed,) = _direct_ids(own_r)
    own_r.client_kill_filter(_id=killed)
    job = work.enqueue()  # through the client's retry, then on a new connection of its own
    work.enqueue()
    assert own_r.hexists(own_app.keys.jobs, job.id)
    assert entries(own_r, own_app.keys.jobs) == 3
    assert killed not in _direct_ids(own_r)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
async def test_a_forked_child_enqueues_on_its_own_connection_and_leaves_the_parents_alone(
    own_app: drumbeat.App, own_r: redis.Redis
) -> None:
    @own_app.task
    def work(who: str) -> None: ...

    work.enqueue("parent")
    (parent_conn,) = _direct_ids(own_r)
    connections_before = own_r.info("stats")["total_connections_received"]
    pid = os.fork()
    if pid == 0:  # the child: enqueue, then leave without running the parent's cleanup
        code = 1
        try:
            work.enqueue("child")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child's enqueue failed"
    opened = own_r.info("stats")["total_connections_received"] - connections_before
    assert opened == 1, f"the child should open one connection of its own, opened {opened}"
    work.enqueue("parent again")
    assert entries(own_r, own_app.keys.jobs) == 3
    assert parent_conn in _direct_ids(own_r), (
        "the parent's connection should survive the child (the child must open its own and "
        "never close or shut down the inherited socket)"
    )


async def test_a_producer_whose_redis_stops_answering_gets_a_timeout_not_a_hang(
    own_redis: RedisServer, namespace: str
) -> None:
    # The producer's own connection waits on a blocking socket with the kernel's timeout
    # (SO_RCVTIMEO), not Python's: without it, this enqueue would wait forever.
    app = drumbeat.App(f"{own_redis.url}?socket_timeout=1", namespace=namespace)

    @app.task
    def work() -> None: ...

    try:
        work.enqueue()  # this thread's own connection is open from here on
        assert own_redis.proc is not None
        os.kill(own_redis.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(redis.TimeoutError):
                work.enqueue()
        finally:
            os.kill(own_redis.proc.pid, signal.SIGCONT)
        job = work.enqueue()  # and it recovers once Redis answers again
        assert job.status() == drumbeat.JobStatus.QUEUED
    finally:
        app.close()
