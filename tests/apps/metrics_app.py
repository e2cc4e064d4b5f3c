"""Tasks for the dashboard's two-process metrics test; the App comes from DRUMBEAT_* variables."""

from __future__ import annotations

import asyncio
import os

import drumbeat

app = drumbeat.App()


@app.task(name="ok")
async def ok(n: int) -> int:
    # Long enough that one process alone could not take every job while the other idles.
    await asyncio.sleep(0.02)
    return os.getpid()


@app.task(name="bad", retries=1, backoff=0.01, backoff_max=0.01)
async def bad(n: int) -> None:
    await asyncio.sleep(0.02)
    raise RuntimeError(f"bad {n}")
