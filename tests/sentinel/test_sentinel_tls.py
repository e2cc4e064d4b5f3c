"""drumbeat through sentinels over TLS (``rediss+sentinel://``): the sentinels, the master and
its replica on TLS ports only, client certificates required; jobs, a schedule, the producer's
fast path, a supervisor and the CLI, and a worker that follows a failover over TLS."""

from __future__ import annotations

import ssl
import uuid

import pytest
import redis

import drumbeat
from drumbeat import connections, sentinel
from tests.conftest import running_worker
from tests.ha_process import check_processes_on
from tests.helpers import wait_for_async
from tests.sentinel.conftest import SentinelSetup
from tests.sentinel.test_sentinel import carries_on_after_the_master_is_killed


def test_a_rediss_sentinel_url_gives_its_tls_options_to_the_sentinels_and_the_master() -> None:
    parsed = sentinel.parse(
        "rediss+sentinel://h:26379/mymaster?ssl_ca_certs=/ca.crt&sentinel_password=sp"
    )
    assert parsed.options == {"ssl": True, "ssl_ca_certs": "/ca.crt"}
    assert parsed.sentinel_options == {"password": "sp", "ssl": True, "ssl_ca_certs": "/ca.crt"}
    assert sentinel.is_sentinel("REDISS+SENTINEL://h:1/m")
    assert "ssl" not in sentinel.parse("redis+sentinel://h:26379/mymaster").options


async def test_jobs_and_a_schedule_run_through_sentinels_over_tls(
    sentinel_tls: SentinelSetup,
) -> None:
    app = drumbeat.App(sentinel_tls.url, namespace="s" + uuid.uuid4().hex[:12])
    ticks: list[int] = []

    @app.task
    def double(n: int) -> int:
        return n * 2

    @app.task
    def tick() -> None:
        ticks.append(1)

    try:
        job = double.enqueue(21)
        direct = app.connections.direct
        assert isinstance(direct, connections.Direct)
        held = direct._local.held
        assert held is not None and isinstance(held.wire._sock, ssl.SSLSocket)
        ajob = await double.aenqueue(4)
        app.schedule("tick", tick, every=1)
        async with running_worker(app, concurrency=2):
            assert await job.aresult(timeout=20) == 42
            assert await ajob.aresult(timeout=20) == 8
            assert job.result(timeout=5) == 42
            await wait_for_async(
                lambda: len(ticks), lambda n: n >= 2, message="the schedule ran twice", timeout=30
            )
    finally:
        await app.aclose()


@pytest.mark.slow
async def test_a_worker_follows_a_failover_over_tls(own_sentinel_tls: SentinelSetup) -> None:
    """kill -9 of the master; the sentinels promote the replica. Every node listens on a TLS
    port only and requires a client certificate, so the worker's claim and settle connections
    (and the producer's) reach the new master only if they reconnect with the URL's TLS
    options: a connection that kept the address but lost the certificates is refused."""
    await carries_on_after_the_master_is_killed(own_sentinel_tls)


@pytest.mark.process
def test_a_supervisor_and_the_cli_work_through_sentinels_over_tls(
    sentinel_tls: SentinelSetup,
) -> None:
    check_processes_on(sentinel_tls.url)


async def test_a_missing_client_certificate_says_what_the_url_must_give(
    sentinel_tls: SentinelSetup,
) -> None:
    base, _, query = sentinel_tls.url.partition("?")
    kept = "&".join(
        o for o in query.split("&") if not o.startswith(("ssl_certfile", "ssl_keyfile"))
    )
    app = drumbeat.App(f"{base}?{kept}", namespace="s" + uuid.uuid4().hex[:12])

    @app.task
    def noop() -> None:
        pass

    expected = r"TLS connection to the sentinel at 127\.0\.0\.1:\d+ failed .*ssl_certfile="
    try:
        with pytest.raises(redis.ConnectionError, match=expected):
            noop.enqueue()
        with pytest.raises(redis.ConnectionError, match=expected):
            await noop.aenqueue()
    finally:
        await app.aclose()
