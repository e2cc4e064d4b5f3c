"""An app for the supervisor tests: per-process hooks note their pid in Redis; with
SUP_APP_BROKEN set, every process fails its start-up (a crash loop). Some tasks hang their
worker, as badly written tasks do."""

from __future__ import annotations

import asyncio
import os
import time

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


@app.task
async def block_once(marker: str) -> int:
    """Blocks its worker's event loop for good, the first time it runs (the marker says so)."""
    if _log.set(marker, os.getpid(), nx=True):
        time.sleep(3600)
    return os.getpid()


@app.task(timeout=0.3, retries=0)
def stick() -> None:
    """Runs far past its timeout, holding its thread of the task pool."""
    time.sleep(3600)


@app.task(timeout=60)
def doze(seconds: float) -> int:
    """A long sync task within its timeout."""
    time.sleep(seconds)
    return os.getpid()
