"""A real Redis Cluster for the session: 3 masters and 3 replicas, each a `redis-server
--cluster-enabled yes` on a free port in a temp dir, joined with ``redis-cli --cluster create``;
and a TLS-only one (``tls_cluster``: 3 masters, no replicas, ``--port 0 --tls-port ...
--tls-cluster yes``, client certificates required, made by `tests.tls.conftest`'s helpers).

Without ``redis-server`` and ``redis-cli`` (and ``openssl`` for the TLS cluster) on PATH the
cluster tests are skipped, except in CI (``CI`` set), where that is a failure (.ci/run installs
them).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

import drumbeat
from tests.conftest import fresh_port
from tests.tls.conftest import make_certificates, tls_args, tls_options

MISSING = (
    "the Redis Cluster tests need redis-server and redis-cli on PATH "
    "(Debian: apt-get install redis-server redis-tools)"
)

MISSING_TLS = (
    "the TLS Redis Cluster tests need redis-server (built with TLS), redis-cli and openssl on "
    "PATH (Debian: apt-get install redis-server redis-tools openssl)"
)

MASTERS = 3
START_TIMEOUT = 30.0


class Node:
    """One cluster node: a redis-server process on its own port and data dir; with ``certs``,
    the port is a TLS port (the only one), and the cluster bus and replication are TLS too."""

    def __init__(self, binary: str, root: Path, certs: Path | None = None) -> None:
        self.binary = binary
        self.certs = certs
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None
        self.pick_ports()

    def pick_ports(self) -> None:
        """Free ports (again, after another process took one between the pick and the bind)."""
        self.port = fresh_port()
        # Its own bus port: the default (port + 10000) may be taken, or past 65535.
        self.bus_port = fresh_port()
        self.dir = self.root / str(self.port)
        self.dir.mkdir()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        if self.certs is None:
            ports = ["--port", str(self.port)]
        else:
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cluster", "yes",
                     *tls_args(self.certs)]  # fmt: skip
        self.proc = subprocess.Popen(
            [self.binary, *ports, "--bind", "127.0.0.1",
             "--dir", str(self.dir), "--cluster-enabled", "yes",
             "--cluster-port", str(self.bus_port),
             "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
             "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction",
             "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=5, **tls_options(self.certs)
        )

    def kill(self) -> None:
        """kill -9: no shutdown, no goodbye to the other nodes."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class ClusterServer:
    """`MASTERS` masters, each with ``replicas`` replicas; `url` is the ``redis+cluster://``
    URL naming every node. With ``tls``, every node speaks TLS only and requires a client
    certificate (made by `make_certificates` in ``certs``), and `url` is a
    ``rediss+cluster://`` URL with the CA and the client certificate."""

    def __init__(self, server: str, cli: str, *, replicas: int = 1, tls: bool = False) -> None:
        self.cli = cli
        self.replicas = replicas
        self.root = Path(tempfile.mkdtemp(prefix="drumbeat-cluster-", dir="/tmp"))
        self.certs: Path | None = None
        if tls:
            self.certs = self.root / "certs"
            self.certs.mkdir()
        count = MASTERS * (1 + replicas)
        self.nodes = [Node(server, self.root, self.certs) for _ in range(count)]

    @property
    def url(self) -> str:
        hosts = ",".join(n.address for n in self.nodes)
        if self.certs is None:
            return "redis+cluster://" + hosts
        query = {k: v for k, v in tls_options(self.certs).items() if k != "ssl"}
        return f"rediss+cluster://{hosts}?{urlencode(query)}"

    def _cli_tls(self) -> list[str]:
        if self.certs is None:
            return []
        return ["--tls", "--cacert", str(self.certs / "ca.crt"),
                "--cert", str(self.certs / "client.crt"),
                "--key", str(self.certs / "client.key")]  # fmt: skip

    def start(self) -> None:
        if self.certs is not None:
            make_certificates(self.certs)
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            for attempt in range(3):
                try:
                    _poll(lambda n=node: _pings(n), f"cluster node {node.address} did not start")
                    break
                except PortTaken:
                    if attempt == 2:
                        raise
                    node.pick_ports()
                    node.start()
        created = subprocess.run(
            [self.cli, *self._cli_tls(), "--cluster", "create", *(n.address for n in self.nodes),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
        )  # fmt: skip
        if created.returncode != 0:  # redis-cli says why on stdout
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout[-2000:]}")
        for node in self.nodes:
            _poll(lambda n=node: _state_ok(n), f"cluster node {node.address} never saw "
                  "cluster_state:ok")  # fmt: skip
            # A replica that has not synced with its master yet would never take over from it.
            _poll(lambda n=node: _in_sync(n), f"replica {node.address} did not sync")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def client(self) -> RedisCluster:
        """A cluster client that starts from every node still running (a test kills some)."""
        alive = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        startup = [ClusterNode("127.0.0.1", n.port) for n in alive]  # type: ignore[no-untyped-call]
        return RedisCluster(startup_nodes=startup, socket_timeout=5, **tls_options(self.certs))

    def node_of(self, key: str) -> Node:
        """The node that serves ``key``'s slot now (its master)."""
        with self.client() as client:
            owner = client.get_node_from_key(key)
            return next(n for n in self.nodes if n.port == owner.port)


class PortTaken(RuntimeError):
    """A node could not bind a port picked free: another process took it meanwhile."""


def _pings(node: Node) -> bool:
    assert node.proc is not None
    if node.proc.poll() is not None:
        log = (node.dir / "redis.log").read_text(errors="replace")[-2000:]
        kind = PortTaken if "Address already in use" in log else RuntimeError
        raise kind(f"redis-server on port {node.port} exited ({node.proc.returncode}):\n{log}")
    try:
        with node.client() as client:
            return bool(client.ping())
    except redis.ConnectionError:
        return False


def _state_ok(node: Node) -> bool:
    with node.client() as client:
        info = client.execute_command("CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text


def _in_sync(node: Node) -> bool:
    with node.client() as client:
        role = client.execute_command("ROLE")
    kind = role[0].decode() if isinstance(role[0], bytes) else role[0]
    state = role[3].decode() if kind == "slave" and isinstance(role[3], bytes) else role[-1]
    return kind == "master" or state == "connected"


def _poll(check: object, message: str, timeout: float = START_TIMEOUT) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{message} within {timeout:.0f} s")
        time.sleep(0.05)


def _binaries(missing: str, *also: str) -> tuple[str, str]:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None or not all(shutil.which(name) for name in also):
        if os.environ.get("CI"):
            pytest.fail(f"{missing}; CI must run the cluster tests (.ci/run installs them)")
        pytest.skip(missing)
    return server, cli


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterServer]:
    cluster = ClusterServer(*_binaries(MISSING))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def tls_cluster() -> Iterator[ClusterServer]:
    """3 masters, no replicas, TLS only (the whole public API needs no more to be checked
    over TLS; failover is `redis_cluster`'s)."""
    cluster = ClusterServer(*_binaries(MISSING_TLS, "openssl"), replicas=0, tls=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def own_cluster(redis_cluster: ClusterServer) -> Iterator[ClusterServer]:
    """A cluster for one test alone (it kills nodes); ``redis_cluster`` skips it where the
    binaries are missing."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    assert server is not None and cli is not None
    cluster = ClusterServer(server, cli)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_namespace() -> str:
    return "c" + uuid.uuid4().hex[:12]


@pytest.fixture
async def cluster_app(
    redis_cluster: ClusterServer, cluster_namespace: str
) -> AsyncIterator[drumbeat.App]:
    app = drumbeat.App(redis_cluster.url, namespace=cluster_namespace)
    yield app
    await app.aclose()
