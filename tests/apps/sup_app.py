"""An app for the supervisor tests: per-process hooks note their pid in Redis; with
SUP_APP_BROKEN set, every process fails its start-up (a crash loop)."""

from __future__ import annotations

import asyncio
import os

import redis

import drumbeat

app = drumbeat.App()
_log = redis.Redis.from_url(os.environ["DRUMBEAT_REDIS_URL"])
KEY = f"test:{{{app.keys.namespace}}}:sup"


@app.on_startup
def opened() -> None:
    if os.environ.get("SUP_APP_BROKEN"):
        raise ConnectionRefusedError("the database is not there")
    _log.rpush(KEY, f"start|{os.getpid()}")


@app.on_shutdown
async def closed() -> None:
    _log.rpush(KEY, f"stop|{os.getpid()}")


@app.task
async def nap(seconds: float) -> int:
    await asyncio.sleep(seconds)
    return os.getpid()
