"""Batches when Redis itself is killed -9 and restarted with its AOF (``appendfsync always``):
the batch, its counts and its waiting callbacks survive, each member is counted once, and the
callback runs once, after every member ended."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import drumbeat
from tests.conftest import RedisServer, running_worker

from .conftest import open_app, until

pytestmark = pytest.mark.chaos


async def test_a_batch_survives_redis_killed_and_restarted_mid_batch(make_server: Any) -> None:
    server: RedisServer = make_server("--appendonly", "yes", "--appendfsync", "always")
    events: list[tuple[str, str]] = []
    async with open_app(server) as app:

        @app.task(name="chaos.member")
        async def member(seconds: float) -> None:
            job = drumbeat.current_job().job_id
            events.append(("start", job))
            await asyncio.sleep(seconds)
            events.append(("end", job))

        @app.task(name="chaos.callback")
        async def callback() -> None:
            events.append(("callback", drumbeat.current_job().job_id))

        batch = await app.abatch(
            [member.prepare(0.05 * (i % 4)) for i in range(40)], on_complete=callback.prepare()
        )
        async with running_worker(app, concurrency=4):
            await until(lambda: len(events) >= 10, "the first members to run")
            # A waiter blocked on the batch's channel while Redis goes away and comes back.
            waiting = asyncio.create_task(batch.await_done(timeout=30))
            await asyncio.sleep(0.1)
            assert server.proc is not None
            server.proc.kill()
            server.proc.wait(10)
            await asyncio.sleep(0.5)  # acks wait for Redis meanwhile
            server.spawn()
            await asyncio.to_thread(server.wait_ready)
            status = await waiting
            assert batch.on_complete is not None
            await batch.on_complete.aresult(timeout=30)
        assert (status.total, status.succeeded, status.pending) == (40, 40, 0)
        callbacks = [i for i, e in enumerate(events) if e[0] == "callback"]
        assert len(callbacks) == 1
        last_end = max(i for i, e in enumerate(events) if e[0] == "end")
        assert callbacks[0] > last_end
        r = await app.aredis()
        assert await r.hlen(app.keys.members) == 0
