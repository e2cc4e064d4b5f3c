"""An app for the PostgreSQL process test: each job notes which worker process and which
database connection (backend pid) ran it. The jobs of a batch wait until two worker processes
have joined the batch, so with 4 slots each both processes run every batch of 8."""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
import redis

import drumbeat

app = drumbeat.App()
_r = redis.Redis.from_url(os.environ["DRUMBEAT_REDIS_URL"])


@app.resource("db", check=lambda c: c.execute("select 1"), close=lambda c: c.close())
def db() -> psycopg.Connection[Any]:
    return psycopg.connect(os.environ["PG_APP_DSN"], autocommit=True)


@app.task
def where(batch_key: str) -> list[int]:
    row = drumbeat.resource("db").execute("select pg_backend_pid()").fetchone()
    assert row is not None
    _r.sadd(batch_key, os.getpid())
    deadline = time.monotonic() + 30
    while _r.scard(batch_key) < 2:  # hold this slot until the other process has joined
        if time.monotonic() > deadline:
            raise TimeoutError(f"only one worker process joined batch {batch_key} in 30 s")
        time.sleep(0.01)
    return [os.getpid(), int(row[0]), db.created]
