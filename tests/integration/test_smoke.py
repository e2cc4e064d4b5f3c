from __future__ import annotations

import drumbeat
from tests.conftest import running_worker


async def test_async_and_sync_tasks_run_and_return(app: drumbeat.App) -> None:
    @app.task
    async def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="mul")
    def mul(a: int, b: int) -> int:
        return a * b

    j1 = await add.aenqueue(2, 3)
    j2 = await mul.aenqueue(4, b=5)
    assert await j1.astatus() is drumbeat.JobStatus.QUEUED
    async with running_worker(app, concurrency=4):
        assert await j1.aresult(timeout=5) == 5
        assert await j2.aresult(timeout=5) == 20
    assert await j1.astatus() is drumbeat.JobStatus.COMPLETE


async def test_msgpack_codec_round_trip(redis_url: str, namespace: str) -> None:
    app = drumbeat.App(redis_url, namespace=namespace, codec="msgpack")

    @app.task
    async def echo(value: object) -> object:
        return value

    job = await echo.aenqueue({"bytes": b"\x00\x01", "n": [1, 2.5, None]})
    async with running_worker(app):
        assert await job.aresult(timeout=5) == {"bytes": b"\x00\x01", "n": [1, 2.5, None]}
    await app.aclose()
