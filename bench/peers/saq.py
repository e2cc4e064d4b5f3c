"""SAQ with its Redis queue: one worker process, ``concurrency=10`` (its default), async no-op
functions (SAQ passes job arguments as keywords)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from saq import Queue, Worker
from saq.queue.redis import RedisQueue
from saq.types import Context

from bench.adapter import SINK, Base, Loop, Started, apaced, versions, worker_command

FILL_CHUNK = 100
"""Jobs enqueued concurrently when filling the queue (untimed), SAQ having no bulk enqueue."""


async def noop(ctx: Context, *, i: int) -> None:
    SINK.noop()


async def stamped(ctx: Context, *, sent_at: float) -> None:
    SINK.stamped(sent_at)


class SaqSystem(Base):
    name = "saq"
    settings = (
        "1 process: saq Worker, concurrency=10 (default), blocking dequeue (default), "
        "async no-op functions"
    )
    bulk = None
    priority = None  # the Postgres queue has priorities; the Redis one does not

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.loop = Loop()
        self.queue = cast(RedisQueue, Queue.from_url(url))
        self.loop.run(self.queue.connect())

    def version(self) -> str:
        return versions("saq", "redis", "hiredis")

    def enqueue_one_by_one(self, n: int) -> None:
        async def go() -> None:
            enqueue = self.queue.enqueue
            for i in range(n):
                await enqueue("noop", i=i)

        self.loop.run(go())

    def fill(self, n: int) -> None:
        async def go() -> None:
            for start in range(0, n, FILL_CHUNK):
                stop = min(n, start + FILL_CHUNK)
                await asyncio.gather(*(self.queue.enqueue("noop", i=i) for i in range(start, stop)))

        self.loop.run(go())

    def produce_stamped(self, rate: float, n: int) -> float:
        return self.loop.run(apaced(rate, n, lambda t: self.queue.enqueue("stamped", sent_at=t)))

    def outstanding(self) -> int:
        return int(self.admin.zcard(self.queue._incomplete))

    def worker_argv(self, priority: bool = False) -> list[str]:
        return worker_command(__name__, self.url)

    def close(self) -> None:
        self.loop.run(self.queue.disconnect())
        self.loop.close()
        super().close()


async def _worker(url: str) -> None:
    queue = Queue.from_url(url)
    worker = Worker(queue, functions=[noop, stamped])
    started = Started()
    await worker.start()  # SIGTERM: stops, running jobs are cancelled
    started.report()


def worker_main(url: str, options: dict[str, Any]) -> None:
    asyncio.run(_worker(url))
