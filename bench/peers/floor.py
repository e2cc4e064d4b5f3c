"""Not a job queue: the floor a Redis-backed queue cannot go under on this host.

The producer sends the bare value with ``LPUSH`` (one round trip, no record, no id); the worker
is one process blocked in ``BRPOP`` on redis-py's async client and records the start of each
value it pops. No lease, no state, no retry: what is left is the hops themselves (producer ->
Redis -> an idle worker woken up -> its event loop), which every system in the table also pays.
It runs the enqueue-one-by-one and latency scenarios only, so that a latency target can be read
against what one hop costs on the machine at hand.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis
import redis.asyncio as aredis

from bench.adapter import SINK, Base, Started, on_sigterm, paced, versions, worker_command

KEY = "floor"
"""The list the producer pushes to and the worker pops from."""
BLOCK = 1
"""Seconds each ``BRPOP`` blocks, so a stop is seen within this."""
NOOP = b"-"
"""What a no-op "job" pushes; a stamped one pushes its send time."""


class FloorSystem(Base):
    name = "floor"
    settings = (
        "not a queue: 1 process, redis-py asyncio client blocked in BRPOP, the value pushed "
        "with LPUSH; no record, lease or state (the cost of the hops alone)"
    )
    scenarios = frozenset({"enqueue_one", "latency"})
    """The only scenarios it runs: in the others a bare list has nothing to show."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.client = redis.Redis.from_url(url, socket_connect_timeout=5)

    def version(self) -> str:
        return versions("redis", "hiredis")

    def enqueue_one_by_one(self, n: int) -> None:
        lpush = self.client.lpush
        for _ in range(n):
            lpush(KEY, NOOP)

    def produce_stamped(self, rate: float, n: int) -> float:
        lpush = self.client.lpush
        return paced(rate, n, lambda sent_at: lpush(KEY, repr(sent_at)))

    def outstanding(self) -> int:
        return int(self.admin.llen(KEY))

    def worker_argv(self, priority: bool = False) -> list[str]:
        return worker_command(__name__, self.url)

    def close(self) -> None:
        self.client.close()
        super().close()


async def _pop_until_stopped(url: str, stop: asyncio.Event) -> None:
    client = aredis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=BLOCK + 10)
    try:
        while not stop.is_set():
            popped = await client.brpop([KEY], BLOCK)
            if popped is None:
                continue
            if popped[1] == NOOP:
                SINK.noop()
            else:
                SINK.stamped(float(popped[1]))
    finally:
        await client.aclose()


def worker_main(url: str, options: dict[str, Any]) -> None:
    started = Started()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        on_sigterm(lambda: loop.call_soon_threadsafe(stop.set))
        await _pop_until_stopped(url, stop)

    asyncio.run(run())
    started.report()
