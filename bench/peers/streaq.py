"""streaq (Redis streams, through coredis): one worker process, ``concurrency=16`` (its
default; prefetch as many again), two priorities ``low`` (the default) and ``high``, async no-op
tasks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from streaq import Worker

from bench.adapter import SINK, Base, Loop, Started, apaced, versions, worker_command

T = TypeVar("T")
PRIORITIES = ["low", "high"]
"""Lowest to highest; a task without one goes to the lowest."""
LONG_URGENT: dict[str, Any] = {}
"""The urgent-behind-long scenario's tasks, by name (set by `_declare`)."""


def _declare(url: str, concurrency: int = 16) -> tuple[Worker[Any], Any, Any, Any]:
    worker: Worker[Any] = Worker(
        redis_url=url, priorities=list(PRIORITIES), concurrency=concurrency
    )

    @worker.task(name="noop")
    async def noop(i: int) -> None:
        SINK.noop()

    @worker.task(name="stamped")
    async def stamped(sent_at: float) -> None:
        SINK.stamped(sent_at)

    @worker.task(name="high")
    async def high(i: int) -> None:
        SINK.high()

    @worker.task(name="long", timeout=600)
    async def long(units: int, unit_s: float) -> None:
        SINK.long_start()
        for _ in range(units):
            await asyncio.sleep(unit_s)
        SINK.long_end()

    @worker.task(name="urgent")
    async def urgent(sent_at: float) -> None:
        SINK.stamped(sent_at)

    LONG_URGENT.update(long=long, urgent=urgent)
    return worker, noop, stamped, high


class StreaqSystem(Base):
    name = "streaq"
    settings = (
        "1 process: streaq Worker, concurrency=16 (default), prefetch 16 (default), "
        "async no-op tasks"
    )
    bulk = "worker.enqueue_many([task.enqueue(i) ...]) (one pipeline)"
    priority = "Worker(priorities=['low', 'high']), task.enqueue(i).start(priority='high')"
    urgent_long = (
        "1 process, Worker(concurrency=4), async tasks (units are asyncio.sleep), urgent jobs "
        "with priority 'high', long ones 'low'; no checkpoints, so an urgent task waits for a "
        "free slot"
    )

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.loop = Loop()
        self.worker, self.noop, self.stamped, self.high = _declare(url)

    def version(self) -> str:
        return versions("streaq", "coredis")

    def _connected(self, fn: Callable[[], Awaitable[T]]) -> T:
        async def go() -> T:
            async with self.worker:
                return await fn()

        return self.loop.run(go())

    def enqueue_one_by_one(self, n: int) -> None:
        async def go() -> None:
            enqueue = self.noop.enqueue
            for i in range(n):
                await enqueue(i)

        self._connected(go)

    def enqueue_bulk(self, n: int) -> None:
        self._connected(lambda: self.worker.enqueue_many([self.noop.enqueue(i) for i in range(n)]))

    def produce_stamped(self, rate: float, n: int) -> float:
        return self._connected(lambda: apaced(rate, n, self.stamped.enqueue))

    def enqueue_high(self, n: int) -> float:
        async def go() -> float:
            t0 = time.time()
            for i in range(n):
                await self.high.enqueue(i).start(priority="high")
            return t0

        return self._connected(go)

    def fill_long(self, n: int, units: int, unit_s: float) -> None:
        async def go() -> None:
            for _ in range(n):
                await LONG_URGENT["long"].enqueue(units, unit_s)

        self._connected(go)

    def produce_urgent(self, rate: float, n: int) -> float:
        urgent = LONG_URGENT["urgent"]

        async def send(t: float) -> None:
            await urgent.enqueue(t).start(priority="high")

        return self._connected(lambda: apaced(rate, n, send))

    def urgent_long_workers(self) -> tuple[list[list[str]], int]:
        return [worker_command(__name__, self.url, concurrency=4)], 4

    def outstanding(self) -> int:
        """Stream entries (streaq deletes an entry once its task is done) and delayed tasks."""
        with self.admin.pipeline(transaction=False) as pipe:
            for p in PRIORITIES:
                pipe.xlen(self.worker.stream_key + p)
                pipe.zcard(self.worker.queue_key + p)
            return sum(int(x) for x in pipe.execute())

    def worker_argv(self, priority: bool = False) -> list[str]:
        return worker_command(__name__, self.url)

    def close(self) -> None:
        self.loop.close()
        super().close()


async def _worker(url: str, concurrency: int) -> None:
    worker, *_ = _declare(url, concurrency)
    started = Started()
    await worker.run_async()  # SIGTERM: stops (grace_period 0, the default)
    started.report()


def worker_main(url: str, options: dict[str, Any]) -> None:
    asyncio.run(_worker(url, int(options.get("concurrency", 16))))
