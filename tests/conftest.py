"""Fixtures: a real redis-server per test session (never a fake), a fresh namespace per test."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

import drumbeat
from drumbeat.redis_server import find_binary
from drumbeat.replies import Reaped
from drumbeat.scripts import Call
from tests.pg import MISSING, PostgresServer, find_bindir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_HANDED_OUT: set[int] = set()


def fresh_port() -> int:
    """A free port never handed out by this function before in this process: the kernel may
    give the same ephemeral port to two probes in a row once the first probe's socket closed,
    and two nodes of one cluster then picked the same port (seen in CI: the second node's data
    dir, named after its port, already existed)."""
    while True:
        port = _free_port()
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


class RedisServer:
    """A redis-server process of our own on a free port, stopped at the end of the session."""

    def __init__(self, binary: str, *extra: str) -> None:
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="drumbeat-test-", dir="/tmp"))
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.spawn()
        self.wait_ready()

    def spawn(self, *more: str) -> None:
        """Starts the process (on the same port and data dir each time), without waiting."""
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction", *self.extra,
             *more],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def wait_ready(self) -> None:
        """Waits until the server answers PING (a loading server answers LOADING)."""
        assert self.proc is not None
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise RuntimeError(f"{self.binary} did not start") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.dir, ignore_errors=True)

    def halt(self) -> None:
        """Stops the process (SIGTERM: it flushes its AOF, if any) and keeps its data dir."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def version(self) -> str:
        with redis.Redis.from_url(self.url) as client:
            return str(client.info("server")["redis_version"])


# Session fixtures that start several servers (a cluster, sentinels) or a browser. Under
# pytest-xdist (`make test` runs two workers) the tests using one go to the same worker, so it
# starts once, not once per worker.
SHARED_FIXTURES = (
    "redis_cluster", "tls_cluster", "redis_sentinel", "sentinel_auth", "sentinel_tls", "browser",
)  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        shared = [name for name in SHARED_FIXTURES if name in getattr(item, "fixturenames", ())]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))


def server_binary() -> str:
    """`DRUMBEAT_TEST_REDIS_SERVER`, else what the embedded Redis would use."""
    return os.environ.get("DRUMBEAT_TEST_REDIS_SERVER") or str(find_binary())


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collects garbage after each test, so an unclosed client fails the test that leaked it.

    Otherwise its ResourceWarning surfaces whenever the collector happens to run, in some later,
    unrelated test."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(server_binary())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server for this test alone: for tests that read server-wide figures (`INFO
    commandstats`, blocked clients), which the session server's other traffic would change."""
    server = RedisServer(server_binary())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_r(own_redis: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_redis.url)
    yield client
    client.close()


@pytest.fixture
async def own_app(own_redis: RedisServer, namespace: str) -> AsyncIterator[drumbeat.App]:
    a = drumbeat.App(own_redis.url, namespace=namespace)
    yield a
    await a.aclose()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def namespace() -> str:
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
async def app(redis_url: str, namespace: str) -> AsyncIterator[drumbeat.App]:
    a = drumbeat.App(redis_url, namespace=namespace)
    yield a
    await a.aclose()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the session (tests/pg.py). Without PostgreSQL installed the tests
    that use it are skipped, except in CI (``CI`` set), where that is a failure."""
    bindir = find_bindir()
    if bindir is None:
        if os.environ.get("CI"):
            pytest.fail(f"{MISSING}; CI must run the PostgreSQL tests (.ci/run installs it)")
        pytest.skip(MISSING)
    server = PostgresServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(postgres: PostgresServer) -> Iterator[str]:
    """A DSN of a database of this test's own, dropped afterwards (its connections with it)."""
    import psycopg

    name = "t" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres.dsn(), autocommit=True) as admin:
        admin.execute(f"create database {name}")
        yield postgres.dsn(name)
        admin.execute(f"drop database {name} with (force)")


@contextlib.asynccontextmanager
async def running_worker(
    app: drumbeat.App, concurrency: int | None = None, queues: list[str] | None = None
) -> AsyncIterator[drumbeat.Worker]:
    """A worker on the test's own loop, stopped (gracefully) on exit."""
    worker = drumbeat.Worker(app, concurrency=concurrency, queues=queues)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


def reap_call(app: drumbeat.App, **overrides: int) -> Call[Reaped]:
    """The housekeeping script call with generous test defaults; override what a test probes."""
    args = {"max_stalls": 3, "limit": 100, "dead_ttl_ms": 60_000, "worker_ttl_ms": 60_000,
            "result_ttl_ms": 60_000} | overrides  # fmt: skip
    return app.scripts.reap(**args)
