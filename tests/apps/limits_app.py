"""Limited tasks for the limit tests; worker subprocesses build the App from DRUMBEAT_*
variables. Each task notes its start (and end) in Redis with Redis' clock, so a test sees every
start across processes on one timeline."""

from __future__ import annotations

import asyncio
import os

import redis

import drumbeat

app = drumbeat.App()
app.limiter("shop", concurrency=2)
_r = redis.Redis.from_url(os.environ["DRUMBEAT_REDIS_URL"])
TAG = f"{{{app.keys.namespace}}}"

# Notes one event atomically: the Redis time, and for a start the running count of its key.
_NOTE = _r.register_script(
    """
    local t = redis.call('TIME')
    local ms = t[1] * 1000 + math.floor(t[2] / 1000)
    local running = redis.call('INCRBY', KEYS[2], tonumber(ARGV[2]))
    redis.call('RPUSH', KEYS[1], ARGV[1] .. '|' .. ms .. '|' .. running)
    """
)


def note(event: str, key: str, delta: int) -> None:
    ctx = drumbeat.current_job()
    _NOTE(
        keys=[f"test:{TAG}:log", f"test:{TAG}:running:{key}"],
        args=[f"{event}|{key}|{ctx.job_id}|{ctx.attempt}|{os.getpid()}", delta],
    )


async def _run(key: str, seconds: float) -> None:
    note("start", key, 1)
    await asyncio.sleep(seconds)
    note("end", key, -1)


@app.task(rate_limit="10/s")
async def tick(i: int) -> None:
    note("start", "tick", 0)


@app.task(concurrency_limit=2, limit_by="user_id")
async def order(user_id: int, seconds: float) -> None:
    await _run(f"user{user_id}", seconds)


@app.task(concurrency_limit=1)
async def solo(seconds: float) -> None:
    """Takes ``seconds`` on its first attempt only (a run killed mid-way is quick the next)."""
    await _run("solo", seconds if drumbeat.current_job().attempt == 1 else 0.0)


@app.task(limiter="shop")
async def fetch_a(seconds: float) -> None:
    await _run("shop", seconds)


@app.task(limiter="shop")
async def fetch_b(seconds: float) -> None:
    await _run("shop", seconds)
