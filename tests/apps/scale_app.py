"""An app for the autoscaling tests: each run of `work` notes (job number, attempt, pid) in
Redis, so a test sees every job ran exactly once and was never handed back; the process hooks
note each worker's start and stop."""

from __future__ import annotations

import asyncio
import os

import redis

import drumbeat

app = drumbeat.App()
_log = redis.Redis.from_url(os.environ["DRUMBEAT_REDIS_URL"])
KEY = f"test:{{{app.keys.namespace}}}:scale"


@app.on_startup
def opened() -> None:
    _log.rpush(KEY, f"start|{os.getpid()}")


@app.on_shutdown
def closed() -> None:
    _log.rpush(KEY, f"stop|{os.getpid()}")


@app.task
async def work(n: int, seconds: float) -> int:
    _log.rpush(KEY, f"ran|{n}|{drumbeat.current_job().attempt}|{os.getpid()}")
    await asyncio.sleep(seconds)
    return os.getpid()
