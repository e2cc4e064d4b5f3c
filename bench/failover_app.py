"""The app of bench/failover.py: each job records its number in a redis-server outside the
cluster (BENCH_LOG_URL), so what ran survives the failover."""

from __future__ import annotations

import os

import redis

import drumbeat

app = drumbeat.App()
_log = redis.Redis.from_url(os.environ["BENCH_LOG_URL"])


@app.task
def note(n: int) -> None:
    _log.rpush("ran", n)
