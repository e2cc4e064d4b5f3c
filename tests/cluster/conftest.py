"""A real Redis Cluster for the session: 3 masters and 3 replicas, each a `redis-server
--cluster-enabled yes` on a free port in a temp dir, joined with ``redis-cli --cluster create``.

Without ``redis-server`` and ``redis-cli`` on PATH the cluster tests are skipped, except in CI
(``CI`` set), where that is a failure (.ci/run installs them).
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

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

import drumbeat
from tests.conftest import _free_port

MISSING = (
    "the Redis Cluster tests need redis-server and redis-cli on PATH "
    "(Debian: apt-get install redis-server redis-tools)"
)

MASTERS = 3
START_TIMEOUT = 30.0


class Node:
    """One cluster node: a redis-server process on its own port and data dir."""

    def __init__(self, binary: str, root: Path) -> None:
        self.binary = binary
        self.port = _free_port()
        # Its own bus port: the default (port + 10000) may be taken, or past 65535.
        self.bus_port = _free_port()
        self.dir = root / str(self.port)
        self.dir.mkdir()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.dir), "--cluster-enabled", "yes",
             "--cluster-port", str(self.bus_port),
             "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
             "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

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
    """3 masters + 3 replicas; `url` is the ``redis+cluster://`` URL naming every node."""

    def __init__(self, server: str, cli: str) -> None:
        self.cli = cli
        self.root = Path(tempfile.mkdtemp(prefix="drumbeat-cluster-", dir="/tmp"))
        self.nodes = [Node(server, self.root) for _ in range(MASTERS * 2)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(n.address for n in self.nodes)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            _poll(lambda n=node: _pings(n), f"cluster node {node.address} did not start")
        subprocess.run(
            [self.cli, "--cluster", "create", *(n.address for n in self.nodes),
             "--cluster-replicas", "1", "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60,
        )  # fmt: skip
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
        return RedisCluster(startup_nodes=startup, socket_timeout=5)

    def node_of(self, key: str) -> Node:
        """The node that serves ``key``'s slot now (its master)."""
        with self.client() as client:
            owner = client.get_node_from_key(key)
            return next(n for n in self.nodes if n.port == owner.port)


def _pings(node: Node) -> bool:
    assert node.proc is not None
    if node.proc.poll() is not None:
        raise RuntimeError(f"redis-server on port {node.port} exited ({node.proc.returncode})")
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


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterServer]:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        if os.environ.get("CI"):
            pytest.fail(f"{MISSING}; CI must run the cluster tests (.ci/run installs them)")
        pytest.skip(MISSING)
    cluster = ClusterServer(server, cli)
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
