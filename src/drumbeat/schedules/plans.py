"""Reads as plans: a generator that yields `Reads` (the commands of one pipelined round trip;
the driver sends their replies back) and the items it found. `drive` and `adrive` run a plan on
the sync or the async client, so both APIs share every command and parser."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
import redis.asyncio as redis_async

T = TypeVar("T")

Command = tuple[str | int | bytes, ...]


@dataclass(frozen=True, slots=True)
class Reads:
    """The commands of one pipelined round trip, yielded by a plan; their replies come back."""

    commands: list[Command]


Plan = Generator[Reads | T, list[Any], None]
"""A read as a generator: it yields `Reads` and gets their replies, and yields what it found."""


def drive(client: redis.Redis, plan: Plan[T]) -> Iterator[T]:
    """Runs a plan on the sync client, handing out what it finds as it goes."""
    step = next(plan, None)
    while step is not None:
        if isinstance(step, Reads):
            with client.pipeline(transaction=False) as pipe:
                _queue(pipe, step.commands)
                replies = pipe.execute()
        else:
            yield step
            replies = []
        step = send(plan, replies)


async def adrive(client: redis_async.Redis, plan: Plan[T]) -> list[T]:
    """Runs a plan on the asyncio client; returns all it found."""
    found: list[T] = []
    step = next(plan, None)
    while step is not None:
        if isinstance(step, Reads):
            async with client.pipeline(transaction=False) as pipe:
                _queue(pipe, step.commands)
                replies = await pipe.execute()
        else:
            found.append(step)
            replies = []
        step = send(plan, replies)
    return found


def send(plan: Plan[T], replies: list[Any]) -> Reads | T | None:
    """The plan's next step after ``replies`` (None: it is done)."""
    try:
        return plan.send(replies)
    except StopIteration:
        return None


def _queue(pipe: Any, commands: list[Command]) -> None:
    # `Any`: redis-py types `execute_command` on one pipeline class and not the other, and which
    # one changes between versions.
    for command in commands:
        pipe.execute_command(*command)
