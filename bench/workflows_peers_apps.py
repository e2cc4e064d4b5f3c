"""The tasks of bench/workflows_peers.py: a no-op member, a callback that logs its start, a
warm-up task that logs it ran, for drumbeat, Celery and RQ. Each logs to a second Redis
(``BENCH_LOG_URL``), so the broker's commands are the system's own, and one clock (time.time)
serves the enqueuer and every worker. Import with ``BENCH_PEER`` set to "drumbeat", "celery" or
"rq" and ``BENCH_BROKER_URL`` to the system's own redis-server."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

PEER = os.environ.get("BENCH_PEER", "")
BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0")
_log = redis.Redis.from_url(os.environ.get("BENCH_LOG_URL", "redis://127.0.0.1:6379/15"))


def _callback_started() -> None:
    _log.rpush("callback", repr(time.time()))


def _warm() -> None:
    time.sleep(0.05)  # long enough that every worker process takes some
    _log.rpush("warm", os.getpid())


# RQ: plain functions, found by their dotted path
def noop() -> None:
    pass


def callback() -> None:
    _callback_started()


def warm() -> None:
    _warm()


if PEER == "celery":
    from celery import Celery

    # the Redis broker and the Redis result backend (a chord needs a backend), else defaults
    celery_app = Celery("wfbench", broker=BROKER_URL, backend=BROKER_URL)
    celery_app.conf.update(worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)

    @celery_app.task(name="wf.noop")
    def c_noop() -> None:
        pass

    @celery_app.task(name="wf.callback")
    def c_callback(results: list[Any]) -> None:
        _callback_started()

    @celery_app.task(name="wf.warm")
    def c_warm() -> None:
        _warm()


if PEER == "drumbeat":
    import asyncio

    import drumbeat

    app = drumbeat.App(BROKER_URL, namespace="wf")

    @app.task(name="noop")
    async def d_noop() -> None:
        pass

    @app.task(name="callback")
    async def d_callback() -> None:
        _callback_started()

    @app.task(name="warm")
    async def d_warm() -> None:
        await asyncio.sleep(0.05)
        _log.rpush("warm", os.getpid())
