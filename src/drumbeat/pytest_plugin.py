"""pytest fixtures for apps that use drumbeat, loaded through the ``pytest11`` entry point: a
private redis-server for the session, an App on a fresh namespace per test, and a worker that
runs until idle (`drumbeat.testing`). docs/testing.md shows them in use.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from drumbeat import redis_server
from drumbeat.app import App
from drumbeat.errors import ConfigurationError
from drumbeat.testing import DEFAULT_TIMEOUT, arun_until_idle, run_until_idle

_START_TIMEOUT = 10.0


class PrivateRedis:
    """A redis-server of the session's own on a unix socket in a temporary directory: no TCP
    port, nothing saved to disk, stopped (and its directory removed) at the end."""

    def __init__(self) -> None:
        # Short, under /tmp: a unix socket's path is limited to about 100 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="drumbeat-", dir="/tmp"))
        self.socket = self.dir / "redis.sock"
        self.url = f"unix://{self.socket}?db=0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Starts `redis_server.find_binary`'s redis-server and waits until it answers PING.

        Raises:
            ConfigurationError: no redis-server, or it did not come up in time.
        """
        self.proc = subprocess.Popen(
            [str(redis_server.find_binary()), "--port", "0", "--unixsocket", str(self.socket),
             "--unixsocketperm", "700", "--dir", str(self.dir), "--save", "",
             "--appendonly", "no", "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + _START_TIMEOUT
        with redis.Redis(unix_socket_path=str(self.socket)) as client:
            while True:
                try:
                    client.ping()
                    return
                except (redis.ConnectionError, FileNotFoundError):
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        raise ConfigurationError(
                            f"the test redis-server did not answer on {self.socket} within "
                            f"{_START_TIMEOUT:g} s"
                        ) from None
                    time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def drumbeat_redis_url() -> Iterator[str]:
    """The URL of a private redis-server for the test session (never a system service)."""
    server = PrivateRedis()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def drumbeat_namespace() -> str:
    """A namespace of this test's own, so tests share the server but never each other's keys."""
    return "t" + uuid.uuid4().hex[:12]


AppFactory = Callable[..., App]


@pytest.fixture
def drumbeat_app_factory(drumbeat_redis_url: str, drumbeat_namespace: str) -> Iterator[AppFactory]:
    """Makes Apps on the private Redis and this test's namespace (keyword arguments go to
    `App`: settings overrides, another ``namespace``); closes their clients afterwards."""
    made: list[App] = []

    def make(**overrides: Any) -> App:
        overrides.setdefault("namespace", drumbeat_namespace)
        app = App(drumbeat_redis_url, **overrides)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


@pytest.fixture
def drumbeat_app(drumbeat_app_factory: AppFactory) -> App:
    """An App on the private Redis and this test's own namespace."""
    return drumbeat_app_factory()


class WorkerRunner:
    """Runs a real worker of an app until it is idle (`drumbeat.testing.run_until_idle`);
    returns how many runs it made."""

    def __init__(self, app: App) -> None:
        self.app = app

    def __call__(
        self,
        app: App | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        concurrency: int | None = None,
        queues: Sequence[str] | None = None,
    ) -> int:
        """In a plain test (the fixture's app unless ``app`` is given)."""
        return run_until_idle(
            app or self.app, timeout=timeout, concurrency=concurrency, queues=queues
        )

    async def arun(
        self,
        app: App | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        concurrency: int | None = None,
        queues: Sequence[str] | None = None,
    ) -> int:
        """In an async test: on its event loop."""
        return await arun_until_idle(
            app or self.app, timeout=timeout, concurrency=concurrency, queues=queues
        )


@pytest.fixture
def drumbeat_worker(drumbeat_app: App) -> WorkerRunner:
    """``drumbeat_worker()`` runs `drumbeat_app`'s tasks until idle (``drumbeat_worker(app)``
    another app's; ``await drumbeat_worker.arun()`` in an async test)."""
    return WorkerRunner(drumbeat_app)
