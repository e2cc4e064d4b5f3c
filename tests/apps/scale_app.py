"""An app for the autoscaling tests: each run of `work` notes (job number, attempt, pid) in
Redis, so a test sees every job ran exactly once and was never handed back; the process hooks
note each worker's start and stop."""

from __future__ import annotations

import asyncio
import os
import time

import redis

import drumbeat

app = drumbeat.App()
_log = redis.Redis.from_url(os.environ["DRUMBEAT_REDIS_URL"])
KEY = f"test:{{{app.keys.namespace}}}:scale"


@app.on_startup
def opened() -> None:
    _log.rpush(KEY, f"start|{os.getpid()}")
    # A busy start (imports, warming caches): DRUMBEAT_TEST_STARTUP_BURN seconds of CPU.
    end = time.monotonic() + float(os.environ.get("DRUMBEAT_TEST_STARTUP_BURN", "0"))
    while time.monotonic() < end:
        pass


@app.on_shutdown
def closed() -> None:
    _log.rpush(KEY, f"stop|{os.getpid()}")


@app.task
async def work(n: int, seconds: float) -> int:
    _log.rpush(KEY, f"ran|{n}|{drumbeat.current_job().attempt}|{os.getpid()}")
    await asyncio.sleep(seconds)
    return os.getpid()


@app.task
async def burn(seconds: float) -> None:
    """Keeps its process's core busy for ``seconds``, yielding to the loop every few ms (a
    process running many short runs at once looks like this: busy, never blocked)."""
    _log.rpush(KEY, f"burn|{os.getpid()}")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        stop = time.monotonic() + 0.005
        while time.monotonic() < stop:
            pass
        await asyncio.sleep(0)
