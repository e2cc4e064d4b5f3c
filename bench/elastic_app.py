"""The app of the elastic-pool benchmark (`bench.elastic`), run by ``drumbeat worker
bench.elastic_app:app`` under a supervisor.

The harness passes everything through the environment, as a deployment would: the Redis URL
(``DRUMBEAT_REDIS_URL``), the namespace (``DRUMBEAT_NAMESPACE``), ``DRUMBEAT_SCALE_DOWN_AFTER``,
and the job's length (``BENCH_JOB_SECONDS``). Each job awaits that long (I/O standing in for an
HTTP call) and then counts itself in `DONE_KEY`, so the harness knows that every job ran once.
"""

from __future__ import annotations

import asyncio
import os

import redis.asyncio as aredis

import drumbeat

TASK = "bench.elastic.work"
DONE_KEY = "bench:elastic:done"
JOB_SECONDS_ENV = "BENCH_JOB_SECONDS"

app = drumbeat.App()


@app.resource("counter", close=lambda client: client.aclose())
async def _counter() -> aredis.Redis:
    """One client per worker process (made in it, never inherited)."""
    return aredis.Redis.from_url(app.settings.url or "")


@app.task(name=TASK)
async def work(i: int) -> None:
    await asyncio.sleep(float(os.environ.get(JOB_SECONDS_ENV, "0.05")))
    client = await drumbeat.aresource("counter")
    await client.incr(DONE_KEY)
