"""drumbeat over TLS with client certificates and an ACL user: jobs and schedules, the
producer's bare-socket fast path, and clear errors for a wrong password or a missing
certificate."""

from __future__ import annotations

import ssl
import uuid

import pytest
import redis

import drumbeat
from drumbeat import connections
from tests.conftest import running_worker
from tests.ha_process import check_processes_on
from tests.helpers import wait_for_async
from tests.tls.conftest import TlsServer


async def test_jobs_and_a_schedule_run_over_tls_as_an_acl_user(tls_app: drumbeat.App) -> None:
    ticks: list[int] = []

    @tls_app.task
    def double(n: int) -> int:
        return n * 2

    @tls_app.task
    def tick() -> None:
        ticks.append(1)

    job = double.enqueue(21)
    ajob = await double.aenqueue(4)
    tls_app.schedule("tick", tick, every=1)
    async with running_worker(tls_app, concurrency=2):
        assert await job.aresult(timeout=20) == 42
        assert await ajob.aresult(timeout=20) == 8
        assert job.result(timeout=5) == 42  # the synchronous blocking client too
        await wait_for_async(
            lambda: len(ticks), lambda n: n >= 2, message="the schedule ran twice", timeout=30
        )
    assert tls_app.redis.acl_whoami() == "drumbeat"  # type: ignore[no-untyped-call]


async def test_the_producer_fast_path_runs_on_a_tls_socket(tls_app: drumbeat.App) -> None:
    @tls_app.task
    def noop() -> None:
        pass

    noop.enqueue()
    noop.enqueue()
    direct = tls_app.connections.direct
    assert isinstance(direct, connections.Direct)
    held = direct._local.held
    assert held is not None, "the enqueues should have kept this thread's own connection"
    assert isinstance(held.wire._sock, ssl.SSLSocket)
    assert direct.execute("PING") == b"PONG"
    assert direct._local.held is held, "the same connection, not a fallback to the client"


def test_a_tls_fast_path_connection_times_out_instead_of_hanging(tls_redis: TlsServer) -> None:
    """A blocking `ssl.SSLSocket` retries a read the kernel timed out: with the kernel's timeout
    (`SO_RCVTIMEO`) that `_Wire` sets on a plain socket, a reply that never comes would hang."""
    client = connections.sync_client(tls_redis.url(socket_timeout="0.5"))
    direct = connections.Direct(client)
    try:
        with pytest.raises(redis.TimeoutError, match=r"no reply from Redis in 0\.5 s"):
            direct.execute("BLPOP", f"drumbeat-tls-{uuid.uuid4().hex}", 0)
        assert direct.execute("PING") == b"PONG", "a new connection after the timeout"
    finally:
        direct.close()
        client.close()


async def test_a_wrong_password_says_which_user_was_refused(tls_redis: TlsServer) -> None:
    app = drumbeat.App(tls_redis.url(password="wrong"), namespace="t" + uuid.uuid4().hex[:12])

    @app.task
    def noop() -> None:
        pass

    try:
        with pytest.raises(redis.AuthenticationError, match="refused the login of user 'drumbeat'"):
            noop.enqueue()
        with pytest.raises(redis.AuthenticationError, match="enabled ACL user in the URL"):
            await noop.aenqueue()
    finally:
        await app.aclose()


async def test_a_missing_client_certificate_says_what_the_url_must_give(
    tls_redis: TlsServer,
) -> None:
    app = drumbeat.App(tls_redis.url(client_cert=False), namespace="t" + uuid.uuid4().hex[:12])

    @app.task
    def noop() -> None:
        pass

    try:
        with pytest.raises(redis.ConnectionError, match="ssl_certfile= and ssl_keyfile="):
            noop.enqueue()
        with pytest.raises(redis.ConnectionError, match="ssl_certfile= and ssl_keyfile="):
            await noop.aenqueue()
    finally:
        await app.aclose()


@pytest.mark.process
def test_a_supervisor_and_the_cli_work_over_tls(tls_redis: TlsServer) -> None:
    check_processes_on(tls_redis.url())
