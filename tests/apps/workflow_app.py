"""Tasks for the workflow process tests; the worker subprocess builds its App from DRUMBEAT_*
variables."""

from __future__ import annotations

import asyncio
import os

import redis

import drumbeat

app = drumbeat.App()
_log = redis.Redis.from_url(os.environ["DRUMBEAT_REDIS_URL"])
LOG_KEY = f"test:{{{app.keys.namespace}}}:log"


@app.task
async def step(seconds: float) -> str:
    """Notes its start and end (in one list, so Redis orders them across processes)."""
    job = drumbeat.current_job().job_id
    _log.rpush(LOG_KEY, f"start|{job}|{os.getpid()}")
    await asyncio.sleep(seconds)
    _log.rpush(LOG_KEY, f"end|{job}|{os.getpid()}")
    return job
