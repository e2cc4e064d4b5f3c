"""Tasks for bench/limits.py. A worker process built from DRUMBEAT_* variables; each process
keeps its runs' start and end times (wall clock: every process is on one machine, the same clock
Redis' TIME reads) and, for the rate task, the start its limit granted (`Context.granted_ms`,
Redis clock) in memory, and writes them to ``$BENCH_LIMITS_DIR/<pid>.json`` when it stops, so
recording adds no Redis command to the figures."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import drumbeat

RATE = os.environ.get("BENCH_LIMITS_RATE", "500/s")
PER_USER = int(os.environ.get("BENCH_LIMITS_PER_USER", "5"))

app = drumbeat.App()
_runs: list[tuple[str, float, float, float | None]] = []


@app.task(rate_limit=RATE)
async def hit(i: int) -> None:
    now = time.time()
    # getattr: the same app runs against drumbeat versions before granted_ms (bench/README)
    granted = getattr(drumbeat.current_job(), "granted_ms", None)
    _runs.append(("rate", now, now, None if granted is None else granted / 1000))


@app.task(concurrency_limit=PER_USER, limit_by="user_id")
async def order(user_id: int, seconds: float) -> None:
    start = time.time()
    await asyncio.sleep(seconds)
    _runs.append((f"user{user_id}", start, time.time(), None))


@app.on_shutdown
def _dump() -> None:
    out = Path(os.environ["BENCH_LIMITS_DIR"]) / f"{os.getpid()}.json"
    out.write_text(json.dumps(_runs))
