"""A monitor task for the schedule process tests; the App comes from DRUMBEAT_* variables."""

from __future__ import annotations

import asyncio
import os
import time

import redis

import drumbeat

app = drumbeat.App()
_log = redis.Redis.from_url(os.environ["DRUMBEAT_REDIS_URL"])
LOG_KEY = f"test:{{{app.keys.namespace}}}:runs"


@app.task(name="monitor")
async def monitor(n: int) -> None:
    ctx = drumbeat.current_job()
    start = time.time()
    # Long enough that a worker always has runs in flight (a kill -9 then interrupts some).
    await asyncio.sleep(0.05)
    end = time.time()
    # One push per run: schedule, due, start, end (ms), attempt, pid.
    fields = (ctx.schedule_id, ctx.due_ms, f"{start * 1000:.1f}", f"{end * 1000:.1f}",
              ctx.attempt, os.getpid())  # fmt: skip
    _log.rpush(LOG_KEY, "|".join(str(f) for f in fields))
