"""A cluster of M masters and no replicas, slots split in M equal ranges: `redis-cli --cluster
create` refuses fewer than 3 masters, so the nodes are joined by hand (``CLUSTER
ADDSLOTSRANGE``, ``CLUSTER MEET``). Used by the single-master tests and by
`bench.cluster_periodic`."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import redis
from redis.crc import key_slot

from tests.cluster.conftest import Node

SLOTS = 16384


class SmallCluster:
    """``masters`` nodes; master i serves the i-th of M equal slot ranges."""

    def __init__(self, binary: str, masters: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="drumbeat-small-cluster-", dir="/tmp"))
        self.nodes = [Node(binary, self.root) for _ in range(masters)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(n.address for n in self.nodes)

    def master_of(self, key: str) -> int:
        """The index of the node serving ``key``."""
        return key_slot(key.encode()) * len(self.nodes) // SLOTS

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        clients = [n.client() for n in self.nodes]
        try:
            _wait(lambda: all(_pings(c) for c in clients), "the cluster's nodes did not start")
            m = len(self.nodes)
            for i, c in enumerate(clients):
                c.execute_command(
                    "CLUSTER", "ADDSLOTSRANGE", i * SLOTS // m, (i + 1) * SLOTS // m - 1
                )
                c.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
            _wait(lambda: all(_state_ok(c) for c in clients), "the cluster never reached state ok")
        finally:
            for c in clients:
                c.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _pings(c: redis.Redis) -> bool:
    try:
        return bool(c.ping())
    except redis.ConnectionError:
        return False


def _state_ok(c: redis.Redis) -> bool:
    info = c.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
    return "cluster_state:ok" in (info.decode() if isinstance(info, bytes) else str(info))


def _wait(check: object, message: str, timeout: float = 30.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{message} within {timeout:.0f} s")
        time.sleep(0.05)
