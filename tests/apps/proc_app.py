"""Tasks for the process tests; the worker subprocess builds its App from DRUMBEAT_* variables."""

from __future__ import annotations

import asyncio
import gc
import os
import time

import redis

import drumbeat

app = drumbeat.App()
_log = redis.Redis.from_url(os.environ["DRUMBEAT_REDIS_URL"])
LOG_KEY = f"test:{{{app.keys.namespace}}}:log"


def note(event: str) -> None:
    ctx = drumbeat.current_job()
    _log.rpush(LOG_KEY, f"{event}|{ctx.job_id}|{ctx.attempt}|{os.getpid()}")


@app.task
async def nap(seconds: float) -> str:
    note("start")
    await asyncio.sleep(seconds)
    note("end")
    return "rested"


@app.task
def spin(seconds: float) -> int:
    """CPU-bound in a thread: holds the GIL in long stretches."""
    note("start")
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
    note("end")
    return n


@app.task
async def hog(seconds: float) -> str:
    """Blocks the event loop itself, as a badly written async task would."""
    note("start")
    time.sleep(seconds)
    note("end")
    return "done"


@app.task
async def hog_once() -> int:
    """Blocks the event loop for good on its first attempt; returns its pid on the next."""
    note("start")
    if drumbeat.current_job().attempt == 1:
        time.sleep(3600)
    return os.getpid()


@app.task
def units(n: int, seconds: float) -> int:
    """A long job in units, one checkpoint after each; it resumes from its saved progress."""
    start = drumbeat.current_job().progress or 0
    for i in range(start, n):
        note(f"unit{i}")
        time.sleep(seconds)
        drumbeat.checkpoint(progress=i + 1)
    return n


@app.task
async def whoami(seconds: float) -> int:
    """Naps, then answers with the pid of the worker that ran it."""
    note("start")
    await asyncio.sleep(seconds)
    note("end")
    return os.getpid()


@app.task
async def gc_settings() -> list[int]:
    """The worker process's garbage collector: its young generation's threshold, and how many
    objects it froze out of collections."""
    return [gc.get_threshold()[0], gc.get_freeze_count()]
