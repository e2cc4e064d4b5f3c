"""Workflows when Redis itself is killed -9 and restarted with its AOF (``appendfsync
always``): waiting dependents and their counts survive, and each runs after its
dependencies, once they all ended."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

import drumbeat
from tests.conftest import RedisServer, running_worker

from .conftest import open_app, until

pytestmark = pytest.mark.chaos


def _kill_9(server: RedisServer) -> None:
    assert server.proc is not None
    server.proc.kill()
    server.proc.wait(10)


async def test_dependents_survive_redis_killed_and_restarted_mid_workflow(
    make_server: Any,
) -> None:
    server: RedisServer = make_server("--appendonly", "yes", "--appendfsync", "always")
    events: list[tuple[str, str]] = []
    async with open_app(server) as app:

        @app.task(name="chaos.step")
        async def step(seconds: float) -> None:
            job = drumbeat.current_job().job_id
            events.append(("start", job))
            await asyncio.sleep(seconds)
            events.append(("end", job))

        edges: dict[str, list[str]] = {}
        jobs: list[drumbeat.Job[Any]] = []
        for i in range(10):
            chain = await app.achain([step.prepare(0.05 * (i % 3)) for _ in range(4)])
            fan_in = await step.options(depends_on=chain).aenqueue(0.0)
            edges[fan_in.id] = [j.id for j in chain]
            edges.update({b.id: [a.id] for a, b in itertools.pairwise(chain)})
            jobs += [*chain, fan_in]
        async with running_worker(app, concurrency=8):
            await until(lambda: len(events) >= 10, "the first steps to run")
            _kill_9(server)
            await asyncio.sleep(0.5)  # acks wait for Redis meanwhile
            server.spawn()
            await asyncio.to_thread(server.wait_ready)
            deadline = time.monotonic() + 30
            for job in jobs:
                await job.aresult(timeout=max(0.1, deadline - time.monotonic()))
        for dependent, deps in edges.items():
            first = events.index(("start", dependent))
            for dep in deps:
                ends = [i for i, e in enumerate(events) if e == ("end", dep)]
                assert ends and max(ends) < first, f"{dependent} started before {dep} ended"
        k = app.keys
        r = await app.aredis()
        waiting = [await r.hlen(k.deps), await r.hlen(k.dependents), await r.hlen(k.edges)]
        assert waiting == [0, 0, 0]
