"""A real Redis Sentinel setup: one master, one replica and three sentinels (`redis-server <conf>
--sentinel`), each on a free port in a temp dir, with short failure detection so a failover
takes a few seconds; ``sentinel_auth``: the same with a password on the sentinels
(``requirepass``, and ``sentinel sentinel-pass`` so they can talk to each other);
``sentinel_tls``: every process on a TLS port only, client certificates required (made by
`tests.tls.conftest`'s helpers), reached by a ``rediss+sentinel://`` URL.

Without ``redis-server`` (and ``openssl`` for ``sentinel_tls``) on PATH the sentinel tests are
skipped, except in CI (``CI`` set), where that is a failure (.ci/run installs them).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
import redis

import drumbeat
from tests.conftest import fresh_port
from tests.tls.conftest import make_certificates, tls_args, tls_options

MISSING = (
    "the Redis Sentinel tests need redis-server on PATH (Debian: apt-get install redis-server)"
)
MISSING_TLS = (
    "the Redis Sentinel tests over TLS need redis-server (built with TLS) and openssl on PATH "
    "(Debian: apt-get install redis-server openssl)"
)
SERVICE = "mymaster"
START_TIMEOUT = 30.0
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000
SENTINEL_PASSWORD = "sentinel-s3cret"


class Process:
    """One redis-server process (a data node or a sentinel) on its own port and dir."""

    def __init__(
        self, binary: str, root: Path, *, sentinel: bool = False, certs: Path | None = None
    ) -> None:
        self.binary = binary
        self.certs = certs
        self.root = root
        self.pick_port()
        self.sentinel = sentinel
        self.password: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def pick_port(self) -> None:
        """A port free now, and a data dir of its own."""
        self.port = fresh_port()
        self.dir = self.root / str(self.port)
        self.dir.mkdir()

    def start_pinging(self, *args: str) -> None:
        """Starts and waits for its PING; a port another process took between the pick and the
        bind (seen with parallel fixtures) is picked again, up to three times."""
        for attempt in range(3):
            self.start(*args)
            try:
                _poll(lambda: _pings(self), f"redis-server on port {self.port} did not start")
                return
            except PortTaken:
                if attempt == 2:
                    raise
                self.pick_port()

    def start(self, *args: str) -> None:
        conf = self.dir / "redis.conf"
        if self.sentinel:  # a sentinel rewrites its own config file: it must be a file
            lines = [*args]
            conf.write_text("\n".join(lines) + "\n")
            argv = [self.binary, str(conf), "--sentinel", *self._ports()]
        else:
            conf.write_text("")
            argv = [self.binary, str(conf), *self._ports(), *args]
        argv += [
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _ports(self) -> list[str]:
        if self.certs is None:
            return ["--port", str(self.port)]
        return ["--port", "0", "--tls-port", str(self.port), *tls_args(self.certs)]

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=5, password=self.password,
            **tls_options(self.certs),
        )  # fmt: skip

    def kill(self) -> None:
        """kill -9: no shutdown, no goodbye."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class SentinelSetup:
    """A master, a replica and three sentinels watching them as `SERVICE`; `url` is the
    ``redis+sentinel://`` URL naming the sentinels (and their password, if they have one)."""

    def __init__(
        self, binary: str, sentinel_password: str | None = None, *, tls: bool = False
    ) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="drumbeat-sentinel-", dir="/tmp"))
        self.certs: Path | None = None
        if tls:
            self.certs = self.root / "certs"
            self.certs.mkdir()
        self.master = Process(binary, self.root, certs=self.certs)
        self.replica = Process(binary, self.root, certs=self.certs)
        self.sentinels = [
            Process(binary, self.root, sentinel=True, certs=self.certs) for _ in range(3)
        ]
        self.sentinel_password = sentinel_password
        for watcher in self.sentinels:
            watcher.password = sentinel_password

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    @property
    def url(self) -> str:
        query = {k: v for k, v in tls_options(self.certs).items() if k != "ssl"}
        if self.sentinel_password:
            query["sentinel_password"] = self.sentinel_password
        scheme = "redis+sentinel" if self.certs is None else "rediss+sentinel"
        return f"{scheme}://{self.hosts}/{SERVICE}" + (f"?{urlencode(query)}" if query else "")

    @property
    def nodes(self) -> list[Process]:
        return [self.master, self.replica]

    def start(self) -> None:
        if self.certs is not None:
            make_certificates(self.certs)
        # No delay before a diskless full sync (5 s by default): the replica syncs at once.
        common = ["--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction",
                  "--repl-diskless-sync-delay", "0"]  # fmt: skip
        # One after the other: each names the ports of those started before it.
        self.master.start_pinging(*common)
        self.replica.start_pinging(*common, "--replicaof", "127.0.0.1", str(self.master.port))
        _poll(lambda: _in_sync(self.replica), "the replica did not sync with the master")
        auth = []
        if self.sentinel_password:
            auth = [f"requirepass {self.sentinel_password}",
                    f"sentinel sentinel-pass {self.sentinel_password}"]  # fmt: skip
        for watcher in self.sentinels:
            watcher.start_pinging(
                *auth,
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2",
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
                f"sentinel parallel-syncs {SERVICE} 1",
            )
        # A failover needs sentinels that know the replica and each other (they learn both
        # from the master: its INFO and its hello channel, within a few seconds).
        for watcher in self.sentinels:
            _poll(lambda w=watcher: _sees_all(w), f"sentinel {watcher.port} never saw the "
                  "replica and the 2 other sentinels")  # fmt: skip

    def stop(self) -> None:
        for process in [*self.sentinels, *self.nodes]:
            process.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def master_port(self) -> int:
        """The master's port as the sentinels report it now."""
        for watcher in self.sentinels:
            if not watcher.alive:
                continue
            with watcher.client() as client:
                _host, port = client.sentinel_get_master_addr_by_name(SERVICE)
                return int(port)
        raise AssertionError("no sentinel running")

    def node(self, port: int) -> Process:
        return next(n for n in self.nodes if n.port == port)


class PortTaken(RuntimeError):
    """A process could not bind a port picked free: another process took it meanwhile."""


def _pings(process: Process) -> bool:
    if not process.alive:
        assert process.proc is not None
        log = process.dir / "redis.log"
        text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        kind = PortTaken if "Address already in use" in text else RuntimeError
        raise kind(f"redis-server on port {process.port} exited ({process.proc.returncode}); "
                   f"see {log}:\n{text}")  # fmt: skip
    try:
        with process.client() as client:
            return bool(client.ping())
    except redis.ConnectionError:
        return False


def _in_sync(replica: Process) -> bool:
    with replica.client() as client:
        role = client.execute_command("ROLE")
    return bool(role[0] in (b"slave", "slave") and role[3] in (b"connected", "connected"))


def _sees_all(watcher: Process) -> bool:
    if not _pings(watcher):
        return False
    with watcher.client() as client:
        state = client.sentinel_master(SERVICE)
        replicas = client.sentinel_slaves(SERVICE)
    return int(state["num-other-sentinels"]) == 2 and len(replicas) == 1


def _poll(check: Callable[[], bool], message: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{message} within {timeout:.0f} s")
        time.sleep(0.05)


def _binary(*, tls: bool = False) -> str:
    binary = shutil.which("redis-server")
    missing = MISSING_TLS if tls else MISSING
    if binary is None or (tls and shutil.which("openssl") is None):
        if os.environ.get("CI"):
            pytest.fail(f"{missing}; CI must run the sentinel tests (.ci/run installs it)")
        pytest.skip(missing)
    return binary


def _started(sentinel_password: str | None = None, *, tls: bool = False) -> Iterator[SentinelSetup]:
    setup = SentinelSetup(_binary(tls=tls), sentinel_password, tls=tls)
    try:
        setup.start()
        yield setup
    finally:
        setup.stop()


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[SentinelSetup]:
    yield from _started()


@pytest.fixture(scope="session")
def sentinel_auth() -> Iterator[SentinelSetup]:
    """Sentinels that require a password (`SENTINEL_PASSWORD`); `url` gives it."""
    yield from _started(SENTINEL_PASSWORD)


@pytest.fixture(scope="session")
def sentinel_tls() -> Iterator[SentinelSetup]:
    """Sentinels, master and replica on TLS ports only; `url` is ``rediss+sentinel://``."""
    yield from _started(tls=True)


@pytest.fixture
def own_sentinel() -> Iterator[SentinelSetup]:
    """A sentinel setup for this test alone (it kills the master)."""
    yield from _started()


@pytest.fixture
def own_sentinel_tls() -> Iterator[SentinelSetup]:
    """A TLS sentinel setup for this test alone (it kills the master)."""
    yield from _started(tls=True)


@pytest.fixture
async def sentinel_app(redis_sentinel: SentinelSetup) -> AsyncIterator[drumbeat.App]:
    app = drumbeat.App(redis_sentinel.url, namespace="s" + uuid.uuid4().hex[:12])
    yield app
    await app.aclose()
