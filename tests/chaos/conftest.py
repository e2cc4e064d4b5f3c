"""Fault injection on real Redis: each test gets redis-servers of its own, so it can fill,
demote, block, flush, restart them and kill their clients without touching other tests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis

import drumbeat
from tests.conftest import RedisServer, server_binary

# Short enough that a test sees leases lapse, renewals and reaps within a few seconds.
CHAOS_SETTINGS: dict[str, Any] = {
    "lease": 1.5,
    "idle_block": 0.5,
    "maintenance_interval": 0.2,
    "shutdown_grace": 1.0,
}


@pytest.fixture
def make_server() -> Iterator[Callable[..., RedisServer]]:
    """Starts redis-servers with extra arguments; all are stopped after the test."""
    servers: list[RedisServer] = []

    def make(*extra: str) -> RedisServer:
        # A replica's full sync starts at once, not after diskless sync's 5 s default delay.
        server = RedisServer(server_binary(), "--repl-diskless-sync-delay", "0", *extra)
        servers.append(server)
        server.start()
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def own_server(make_server: Callable[..., RedisServer]) -> RedisServer:
    return make_server()


@pytest.fixture
def admin(own_server: RedisServer) -> Iterator[redis.Redis]:
    """A connection for the test's own fault injection (never killed by CLIENT KILL SKIPME)."""
    client = redis.Redis.from_url(own_server.url, socket_timeout=30)
    yield client
    client.close()


@contextlib.asynccontextmanager
async def open_app(server: RedisServer, **overrides: Any) -> AsyncIterator[drumbeat.App]:
    """An app on ``server`` with `CHAOS_SETTINGS` (and ``overrides``), closed on exit."""
    app = drumbeat.App(
        server.url, namespace="c" + uuid.uuid4().hex[:8], **(CHAOS_SETTINGS | overrides)
    )
    try:
        yield app
    finally:
        await app.aclose()


@pytest.fixture
async def chaos_app(own_server: RedisServer) -> AsyncIterator[drumbeat.App]:
    async with open_app(own_server) as app:
        yield app


@pytest.fixture
def worker_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="drumbeat")
    return caplog


async def until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Polls ``check`` until it holds; fails with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout} s still waiting for: {what}")
        await asyncio.sleep(0.02)


def warnings_about(caplog: pytest.LogCaptureFixture, word: str) -> list[str]:
    """The worker's warning lines (and worse) that mention ``word``."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("drumbeat") and r.levelno >= logging.WARNING and word in r.getMessage()
    ]
