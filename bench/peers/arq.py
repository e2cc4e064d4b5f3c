"""arq: one worker process, ``max_jobs=10`` (its default), async no-op functions; it polls the
queue (``poll_delay`` 0.5 s by default) rather than blocking on it."""

from __future__ import annotations

import asyncio
import signal
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


async def long(ctx: dict[str, Any], units: int, unit_s: float) -> None:
    SINK.long_start()
    for _ in range(units):
        await asyncio.sleep(unit_s)
    SINK.long_end()


async def urgent(ctx: dict[str, Any], sent_at: float) -> None:
    SINK.stamped(sent_at)


LONG_QUEUE, URGENT_QUEUE = "arq:long", "arq:urgent"
LONG_SLOTS, URGENT_SLOTS = 3, 1
"""The urgent-behind-long scenario: arq has no priorities, so the urgent jobs get a queue and a
worker of their own, in the same process, with one of the 4 slots kept for them."""


class ArqSystem(Base):
    name = "arq"
    settings = (
        "1 process: arq Worker, max_jobs=10 (default), poll_delay 0.5 s (default), "
        "keep_result 3600 s (default), async no-op functions"
    )
    bulk = None
    priority = None
    urgent_long = (
        f"no priorities, so a queue of their own for the urgent jobs: 1 process running two arq "
        f"Workers (`{LONG_QUEUE}` max_jobs={LONG_SLOTS}, `{URGENT_QUEUE}` max_jobs={URGENT_SLOTS}; "
        "4 slots in all, poll_delay 0.5 s default), async tasks (units are asyncio.sleep); only "
        f"{LONG_SLOTS} long jobs run at once"
    )

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

    def fill_long(self, n: int, units: int, unit_s: float) -> None:
        async def go() -> None:
            for _ in range(n):
                await self.pool.enqueue_job("long", units, unit_s, _queue_name=LONG_QUEUE)

        self.loop.run(go())

    def produce_urgent(self, rate: float, n: int) -> float:
        return self.loop.run(
            apaced(rate, n, lambda t: self.pool.enqueue_job("urgent", t, _queue_name=URGENT_QUEUE))
        )

    def urgent_long_workers(self) -> tuple[list[list[str]], int]:
        return [worker_command(__name__, self.url, split=True)], LONG_SLOTS

    def outstanding(self) -> int:
        with self.admin.pipeline(transaction=False) as pipe:
            for q in (default_queue_name, LONG_QUEUE, URGENT_QUEUE):
                pipe.zcard(q)
            return sum(int(x) for x in pipe.execute())

    def worker_argv(self, priority: bool = False) -> list[str]:
        return worker_command(__name__, self.url)

    def close(self) -> None:
        self.loop.run(self.pool.aclose())
        self.loop.close()
        super().close()


async def _split(url: str) -> None:
    """Two workers in one process, stopped together on SIGTERM."""
    settings = RedisSettings.from_dsn(url)
    workers = [
        Worker(functions=[long], redis_settings=settings, queue_name=LONG_QUEUE,
               max_jobs=LONG_SLOTS, handle_signals=False),
        Worker(functions=[urgent], redis_settings=settings, queue_name=URGENT_QUEUE,
               max_jobs=URGENT_SLOTS, handle_signals=False),
    ]  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    for w in workers:
        w.main_task = asyncio.ensure_future(w.main())
    started = Started()
    await stop.wait()
    for w in workers:
        await w.close()
    await asyncio.gather(*(w.main_task for w in workers if w.main_task), return_exceptions=True)
    started.report(complete=sum(w.jobs_complete for w in workers))


def worker_main(url: str, options: dict[str, Any]) -> None:
    if options.get("split"):
        asyncio.run(_split(url))
        return
    asyncio.set_event_loop(asyncio.new_event_loop())
    worker = Worker(functions=[noop, stamped], redis_settings=RedisSettings.from_dsn(url))
    started = Started()
    worker.run()  # SIGTERM: arq cancels running jobs and stops
    started.report(complete=worker.jobs_complete, failed=worker.jobs_failed)
