"""Resources in a worker: found by name in tasks and hooks, checked once per job (sync tasks in
the thread pool, async tasks on the loop), closed after the app's on_shutdown hooks."""

from __future__ import annotations

import asyncio
from typing import Any

import drumbeat
from tests.conftest import running_worker


class Conn:
    def __init__(self, n: int) -> None:
        self.n = n
        self.checks = 0
        self.closed = False


async def test_tasks_and_hooks_get_the_resource_checked_once_per_job_and_closed_last(
    app: drumbeat.App,
) -> None:
    events: list[str] = []
    made: list[Conn] = []

    def check(conn: Conn) -> None:
        conn.checks += 1

    def close(conn: Conn) -> None:
        conn.closed = True
        events.append(f"closed {conn.n}")

    @app.resource("db", check=check, close=close)
    def db() -> Conn:
        made.append(Conn(len(made) + 1))
        return made[-1]

    @app.on_startup
    def opened() -> None:
        events.append(f"startup got {drumbeat.resource('db').n}")

    @app.on_shutdown
    async def closing() -> None:
        events.append(f"shutdown got {drumbeat.resource('db').n}")

    @app.task
    def sync_job() -> list[int]:
        conns = [drumbeat.resource("db") for _ in range(3)]
        return [c.n for c in conns] + [conns[0].checks]

    @app.task
    async def async_job() -> int:
        for _ in range(3):
            await asyncio.sleep(0)
            conn = drumbeat.resource("db")
        return conn.checks

    async with running_worker(app, concurrency=1):
        assert await (await sync_job.aenqueue()).aresult(timeout=10) == [1, 1, 1, 1]
        assert await (await sync_job.aenqueue()).aresult(timeout=10) == [1, 1, 1, 2]
        assert await (await async_job.aenqueue()).aresult(timeout=10) == 3
    assert events == ["startup got 1", "shutdown got 1", "closed 1"], (
        "the resource should close once, after the on_shutdown hooks (which may use it)"
    )
    # made by the startup hook; the shutdown hook checked it once more (outside a job, every
    # use checks)
    assert made[0].checks == 4 and db.created == 1


async def test_an_async_resource_in_async_tasks(app: drumbeat.App) -> None:
    made: list[dict[str, Any]] = []

    async def check(conn: dict[str, Any]) -> bool:
        conn["checks"] += 1
        return not conn["broken"]

    @app.resource("client", check=check)
    async def client() -> dict[str, Any]:
        await asyncio.sleep(0)
        made.append({"n": len(made) + 1, "checks": 0, "broken": False})
        return made[-1]

    @app.task
    async def use(breaks: bool) -> int:
        conn = await drumbeat.aresource("client")
        if breaks:
            conn["broken"] = True
        return int((await drumbeat.aresource("client"))["n"])

    async with running_worker(app, concurrency=4):
        assert await (await use.aenqueue(False)).aresult(timeout=10) == 1
        assert await (await use.aenqueue(True)).aresult(timeout=10) == 1, "checked once a job"
        assert await (await use.aenqueue(False)).aresult(timeout=10) == 2, "made anew"
    assert client.created == 2
