"""The shop's tests, with drumbeat's pytest plugin alone (copied as test_shop.py into a
directory of their own by tests/plugin/test_plugin.py: no conftest of the project's)."""

from __future__ import annotations

import pytest
import shop

import drumbeat
from drumbeat.testing import NotIdle


def test_an_order_is_charged_after_a_retry_and_shipped(
    drumbeat_redis_url: str, drumbeat_namespace: str, drumbeat_worker
) -> None:
    app = shop.create_app(url=drumbeat_redis_url, namespace=drumbeat_namespace)
    try:
        charged = app.enqueue("shop.charge", 7, 120)
        shipped = app.enqueue("shop.ship", 7)
        assert drumbeat_worker(app) == 3  # two attempts of the charge, one shipping
        assert charged.result(timeout=1) == "charged 120"
        assert shipped.result(timeout=1) == "shipped"
        assert shop.ORDERS[7] == "shipped"
    finally:
        app.close()


def test_a_task_of_the_test_itself(drumbeat_app: drumbeat.App, drumbeat_worker) -> None:
    @drumbeat_app.task
    def square(n: int) -> int:
        return n * n

    jobs = [square.enqueue(n) for n in range(4)]
    assert drumbeat_worker() == 4
    assert [job.result(timeout=1) for job in jobs] == [0, 1, 4, 9]


def test_apps_of_one_test_share_its_namespace(drumbeat_app_factory) -> None:
    producer, consumer = drumbeat_app_factory(), drumbeat_app_factory()
    assert producer.settings.namespace == consumer.settings.namespace


def test_a_job_that_hangs_fails_the_test_clearly(drumbeat_app: drumbeat.App, drumbeat_worker):
    @drumbeat_app.task
    async def hangs() -> None:
        import asyncio

        await asyncio.sleep(30)

    hangs.enqueue()
    with pytest.raises(NotIdle, match="1 running"):
        drumbeat_worker(timeout=0.5)
