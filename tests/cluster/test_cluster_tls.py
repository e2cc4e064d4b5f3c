"""drumbeat on a TLS-only Redis Cluster (``rediss+cluster://``, 3 masters, client certificates
required): producers (the per-master fast path included), a worker with schedule shards on every
master (its per-master `Link`s and idle waits), and a supervisor with the CLI."""

from __future__ import annotations

import ssl
import uuid

import pytest
import redis

import drumbeat
from drumbeat import cluster, connections
from tests.cluster.conftest import ClusterServer
from tests.cluster.test_cluster import _masters_of, _spread_namespace
from tests.conftest import running_worker
from tests.ha_process import check_processes_on
from tests.helpers import wait_for_async

pytestmark = pytest.mark.cluster


def test_a_rediss_cluster_url_connects_to_every_node_over_tls() -> None:
    url = "rediss+cluster://u:p@10.0.0.1:7000,10.0.0.2:7001?ssl_ca_certs=/ca.crt&socket_timeout=2"
    nodes, options = cluster.cluster_nodes(url)
    assert nodes == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]
    assert options == {
        "ssl": True, "ssl_ca_certs": "/ca.crt", "socket_timeout": 2.0,
        "username": "u", "password": "p",
    }  # fmt: skip
    assert connections.is_cluster("REDISS+CLUSTER://h:1")
    assert "ssl" not in cluster.cluster_nodes("redis+cluster://h:1")[1]


async def test_jobs_and_schedules_run_on_every_master_over_tls(tls_cluster: ClusterServer) -> None:
    ns = _spread_namespace(tls_cluster, 3)
    app = drumbeat.App(tls_cluster.url, namespace=ns, schedule_shards=3)
    runs: dict[str, int] = {}

    @app.task
    def double(n: int) -> int:
        return n * 2

    @app.task
    def tick(name: str) -> None:
        runs[name] = runs.get(name, 0) + 1

    try:
        assert isinstance(app.redis, redis.RedisCluster)
        job = double.enqueue(21)
        ajob = await double.aenqueue(4)
        # The producer's fast path: a connection of its own to the jobs' master, over TLS.
        direct = app.connections.direct
        assert isinstance(direct, connections.ClusterDirect)
        wires = [d._local.held.wire for d in direct._directs.values() if d._local.held]
        assert wires, "the enqueue should have kept this thread's connection to its master"
        assert all(isinstance(w._sock, ssl.SSLSocket) for w in wires)

        ids = [f"s{i}" for i in range(12)]
        app.schedule_many([drumbeat.Schedule(i, tick, every=1, args=(i,)) for i in ids])
        masters = _masters_of(tls_cluster, app.scheduler.apart)
        assert len(set(masters)) == 3, f"the 3 shards should be on 3 masters: {masters}"
        async with running_worker(app, concurrency=4):
            assert await job.aresult(timeout=20) == 42
            assert await ajob.aresult(timeout=20) == 8
            await wait_for_async(
                lambda: sorted(runs.get(i, 0) for i in ids),
                lambda counts: counts[0] >= 2,
                message="every schedule, on each of 3 TLS masters, ran twice",
                timeout=30,
            )
        assert job.status() == "complete"
        infos = {info.id: info for info in app.schedules()}
        assert all(infos[i].runs >= 2 for i in ids), {i: infos[i].runs for i in ids}
    finally:
        await app.aclose()


def test_a_tls_cluster_refuses_a_plain_cluster_url(tls_cluster: ClusterServer) -> None:
    """The nodes speak only TLS: the same nodes under ``redis+cluster://`` do not answer."""
    plain = "redis+cluster://" + tls_cluster.url.partition("://")[2].partition("?")[0]
    expected = r"cannot be connected.*expected a rediss\+cluster:// URL"
    with pytest.raises(redis.exceptions.RedisClusterException, match=expected):
        connections.sync_client(plain, socket_timeout=2)  # the cluster client connects at once


async def test_a_missing_client_certificate_says_what_the_url_must_give(
    tls_cluster: ClusterServer,
) -> None:
    base, _, query = tls_cluster.url.partition("?")
    kept = "&".join(
        o for o in query.split("&") if not o.startswith(("ssl_certfile", "ssl_keyfile"))
    )
    app = drumbeat.App(f"{base}?{kept}", namespace="c" + uuid.uuid4().hex[:12])

    @app.task
    def noop() -> None:
        pass

    expected = r"cannot be connected.*Expected ssl_certfile= and ssl_keyfile="
    try:
        with pytest.raises(redis.exceptions.RedisClusterException, match=expected):
            noop.enqueue()
        with pytest.raises(redis.exceptions.RedisClusterException, match=expected):
            await noop.aenqueue()
    finally:
        await app.aclose()


@pytest.mark.process
def test_a_supervisor_and_the_cli_work_on_a_tls_cluster(tls_cluster: ClusterServer) -> None:
    check_processes_on(tls_cluster.url)
