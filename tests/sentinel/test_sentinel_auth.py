"""drumbeat through sentinels that require a password (``requirepass`` in sentinel.conf, given as
``sentinel_password=`` in the URL): jobs, a schedule, a supervisor and the CLI; and a clear error
for a wrong or missing one."""

from __future__ import annotations

import uuid

import pytest
import redis
from redis.backoff import NoBackoff

import drumbeat
from drumbeat import connections
from tests.conftest import running_worker
from tests.ha_process import check_processes_on
from tests.helpers import wait_for_async
from tests.sentinel.conftest import SERVICE, SentinelSetup


def test_the_sentinels_refuse_a_client_without_their_password(sentinel_auth: SentinelSetup) -> None:
    """The fixture's sentinels do require it (else the tests below prove nothing)."""
    with (
        redis.Redis(port=sentinel_auth.sentinels[0].port) as anonymous,
        pytest.raises(redis.AuthenticationError),
    ):
        anonymous.sentinel_masters()


async def test_jobs_and_a_schedule_run_through_sentinels_with_a_password(
    sentinel_auth: SentinelSetup,
) -> None:
    app = drumbeat.App(sentinel_auth.url, namespace="s" + uuid.uuid4().hex[:12])
    ticks: list[int] = []

    @app.task
    def double(n: int) -> int:
        return n * 2

    @app.task
    def tick() -> None:
        ticks.append(1)

    try:
        job = double.enqueue(21)
        ajob = await double.aenqueue(4)
        app.schedule("tick", tick, every=1)
        async with running_worker(app, concurrency=2):
            assert await job.aresult(timeout=20) == 42
            assert await ajob.aresult(timeout=20) == 8
            assert job.result(timeout=5) == 42  # the synchronous blocking client too
            await wait_for_async(
                lambda: len(ticks), lambda n: n >= 2, message="the schedule ran twice", timeout=30
            )
    finally:
        await app.aclose()


@pytest.mark.parametrize(
    ("query", "refused"),
    [("?sentinel_password=wrong", "the password given"), ("", "no password")],
)
async def test_a_wrong_or_missing_sentinel_password_says_what_the_url_must_give(
    sentinel_auth: SentinelSetup, query: str, refused: str
) -> None:
    url = f"redis+sentinel://{sentinel_auth.hosts}/{SERVICE}{query}"
    app = drumbeat.App(url, namespace="s" + uuid.uuid4().hex[:12])

    @app.task
    def noop() -> None:
        pass

    expected = rf"sentinel at 127\.0\.0\.1:\d+ refused {refused} .*sentinel_password="
    try:
        with pytest.raises(redis.AuthenticationError, match=expected):
            noop.enqueue()
        with pytest.raises(redis.AuthenticationError, match=expected):
            await noop.aenqueue()
    finally:
        await app.aclose()


async def test_a_sentinel_that_fails_is_passed_over_at_once() -> None:
    """redis-py's default retry would ask a failing sentinel (or one refusing the login) 3 more
    times after 1, 2 and 4 s before trying the next: a wrong password took ~20 s to report."""
    url = "redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster"
    sync, aio = connections.sync_client(url), connections.async_client(url)
    try:
        for client in (sync, aio):
            for watcher in client.manager.sentinels:  # type: ignore[attr-defined]
                retry = watcher.get_retry()
                assert isinstance(retry._backoff, NoBackoff) and retry._retries <= 1, retry
    finally:
        sync.close()
        await aio.aclose()


@pytest.mark.process
def test_a_supervisor_and_the_cli_work_through_sentinels_with_a_password(
    sentinel_auth: SentinelSetup,
) -> None:
    check_processes_on(sentinel_auth.url)
