"""An app for the Redis Cluster tests of the CLI, the supervisor and the dashboard; the App
comes from ``DRUMBEAT_*`` variables (a ``redis+cluster://`` URL, the namespace, the schedule
shards). Tasks report the pid that ran them in their result, so no side channel is needed
(the supervisor tests' `sup_app` logs to a plain ``redis://`` client, which a cluster refuses)."""

from __future__ import annotations

import asyncio
import os

import drumbeat


def _add(a: int, b: int = 0) -> int:
    return a + b


async def _where(seconds: float = 0.0) -> int:
    await asyncio.sleep(seconds)
    return os.getpid()


def _boom(message: str = "boom") -> None:
    raise RuntimeError(message)


def _tick(name: str) -> int:
    return os.getpid()


def define(app: drumbeat.App) -> None:
    """Registers this module's tasks on ``app`` (a test's worker uses an App of its own)."""
    app.task(name="add")(_add)
    app.task(name="where")(_where)
    app.task(name="boom", retries=0)(_boom)
    app.task(name="tick")(_tick)


app = drumbeat.App()
define(app)
