"""Pausing and resuming a queue (`App.pause_queue`, ``drumbeat queues pause``, the dashboard).

A paused queue's name is in the `pauses` set. Every shard a worker claims from keeps a copy
(the job shards, and the schedule shards when apart), since a script may touch only keys of
its own shard and each claim reads its shard's copy; pausing and resuming write every copy.
The main shard's copy is the one read back (`paused_queues`). A worker that claims on a shard
written a moment later than another takes the queue's jobs there a moment longer: the copies
are written one after the other, each in one call, so they agree once the call returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from drumbeat.keys import DEFAULT_QUEUE
from drumbeat.names import check_name
from drumbeat.scripts import Call

from ._replies import text

if TYPE_CHECKING:
    from drumbeat.app import App

__all__ = [
    "apause_queue",
    "apaused_queues",
    "aresume_queue",
    "pause_queue",
    "paused_queues",
    "resume_queue",
]


def _pauses(app: App, queue: str) -> list[Call[int]]:
    """The calls that pause ``queue`` on every shard, the main shard's first."""
    check_name(queue, "queue name")
    scripts = [*app.job_scripts, *app.scheduler.apart_scripts]
    return [s.pause_queue(queue) for s in scripts]


def _resumes(app: App, queue: str) -> list[Call[int]]:
    """The calls that resume ``queue`` on every shard, the main shard's first; each wakes the
    queue's idle workers there (a schedule shard holds only the default queue's keys)."""
    check_name(queue, "queue name")
    calls = [s.resume_queue(queue) for s in app.job_scripts]
    wake = queue == DEFAULT_QUEUE
    calls += [s.resume_queue(queue, wake=wake) for s in app.scheduler.apart_scripts]
    return calls


def pause_queue(app: App, queue: str) -> bool:
    """Pauses ``queue``; True if it was not paused."""
    replies = [call.run(app.redis) for call in _pauses(app, queue)]
    return replies[0] == 1


def resume_queue(app: App, queue: str) -> bool:
    """Resumes ``queue``; True if it was paused."""
    replies = [call.run(app.redis) for call in _resumes(app, queue)]
    return replies[0] == 1


async def apause_queue(app: App, queue: str) -> bool:
    """`pause_queue` for async callers."""
    client = await app.aredis()
    replies = [await call.arun(client) for call in _pauses(app, queue)]
    return replies[0] == 1


async def aresume_queue(app: App, queue: str) -> bool:
    """`resume_queue` for async callers."""
    client = await app.aredis()
    replies = [await call.arun(client) for call in _resumes(app, queue)]
    return replies[0] == 1


def _sorted(names: Iterable[Any]) -> list[str]:
    return sorted((text(n) for n in names), key=lambda q: (q != DEFAULT_QUEUE, q))


def paused_queues(app: App) -> list[str]:
    """The paused queues (the default one first, then by name)."""
    return _sorted(app.redis.smembers(app.keys.pauses))


async def apaused_queues(app: App) -> list[str]:
    """`paused_queues` for async callers."""
    return _sorted(await (await app.aredis()).smembers(app.keys.pauses))
