"""arq: one worker process, ``max_jobs=10`` (its default), async no-op functions; it polls the
queue (``poll_delay`` 0.5 s by default) rather than blocking on it."""

from __future__ import annotations

import asyncio
from typing import Any

from arq import Worker, create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.constants import default_queue_name

from bench.adapter import SINK, Base, Loop, Started, apaced, versions, worker_command

FILL_CHUNK = 100
"""Jobs enqueued concurrently when filling the queue (untimed), arq having no bulk enqueue."""


async def noop(ctx: dict[str, Any], i: int) -> None:
    SINK.noop()


async def stamped(ctx: dict[str, Any], sent_at: float) -> None:
    SINK.stamped(sent_at)


class ArqSystem(Base):
    name = "arq"
    settings = (
        "1 process: arq Worker, max_jobs=10 (default), poll_delay 0.5 s (default), "
        "keep_result 3600 s (default), async no-op functions"
    )
    bulk = None
    priority = None

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.loop = Loop()
        self.pool: ArqRedis = self.loop.run(create_pool(RedisSettings.from_dsn(url)))

    def version(self) -> str:
        return versions("arq", "redis", "hiredis")

    def enqueue_one_by_one(self, n: int) -> None:
        async def go() -> None:
            enqueue = self.pool.enqueue_job
            for i in range(n):
                await enqueue("noop", i)

        self.loop.run(go())

    def fill(self, n: int) -> None:
        async def go() -> None:
            for start in range(0, n, FILL_CHUNK):
                stop = min(n, start + FILL_CHUNK)
                await asyncio.gather(
                    *(self.pool.enqueue_job("noop", i) for i in range(start, stop))
                )

        self.loop.run(go())

    def produce_stamped(self, rate: float, n: int) -> float:
        return self.loop.run(apaced(rate, n, lambda t: self.pool.enqueue_job("stamped", t)))

    def outstanding(self) -> int:
        return int(self.admin.zcard(default_queue_name))

    def worker_argv(self, priority: bool = False) -> list[str]:
        return worker_command(__name__, self.url)

    def close(self) -> None:
        self.loop.run(self.pool.aclose())
        self.loop.close()
        super().close()


def worker_main(url: str, options: dict[str, Any]) -> None:
    asyncio.set_event_loop(asyncio.new_event_loop())
    worker = Worker(functions=[noop, stamped], redis_settings=RedisSettings.from_dsn(url))
    started = Started()
    worker.run()  # SIGTERM: arq cancels running jobs and stops
    started.report(complete=worker.jobs_complete, failed=worker.jobs_failed)
