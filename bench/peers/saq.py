"""SAQ with its Redis queue: one worker process, ``concurrency=10`` (its default), async no-op
functions (SAQ passes job arguments as keywords)."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
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


async def long(ctx: Context, *, units: int, unit_s: float) -> None:
    SINK.long_start()
    for _ in range(units):
        await asyncio.sleep(unit_s)
    SINK.long_end()


async def urgent(ctx: Context, *, sent_at: float) -> None:
    SINK.stamped(sent_at)


LONG_QUEUE, URGENT_QUEUE = "long", "urgent"
LONG_SLOTS, URGENT_SLOTS = 3, 1
"""The urgent-behind-long scenario: SAQ's Redis queue has no priorities, so the urgent jobs get
a queue and a worker of their own, in the same process, with one of the 4 slots kept for them."""


class SaqSystem(Base):
    name = "saq"
    settings = (
        "1 process: saq Worker, concurrency=10 (default), blocking dequeue (default), "
        "async no-op functions"
    )
    bulk = None
    priority = None  # the Postgres queue has priorities; the Redis one does not
    urgent_long = (
        f"no priorities on Redis, so a queue of their own for the urgent jobs: 1 process running "
        f"two SAQ Workers (`{LONG_QUEUE}` concurrency={LONG_SLOTS}, `{URGENT_QUEUE}` "
        f"concurrency={URGENT_SLOTS}; 4 slots in all), async tasks (units are asyncio.sleep); "
        f"only {LONG_SLOTS} long jobs run at once"
    )

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

    def fill_long(self, n: int, units: int, unit_s: float) -> None:
        async def go() -> None:
            queue = cast(RedisQueue, Queue.from_url(self.url, name=LONG_QUEUE))
            await queue.connect()
            for _ in range(n):
                await queue.enqueue("long", units=units, unit_s=unit_s, timeout=600)
            await queue.disconnect()

        self.loop.run(go())

    def produce_urgent(self, rate: float, n: int) -> float:
        async def go() -> float:
            queue = cast(RedisQueue, Queue.from_url(self.url, name=URGENT_QUEUE))
            await queue.connect()
            try:
                return await apaced(rate, n, lambda t: queue.enqueue("urgent", sent_at=t))
            finally:
                await queue.disconnect()

        return self.loop.run(go())

    def urgent_long_workers(self) -> tuple[list[list[str]], int]:
        return [worker_command(__name__, self.url, split=True)], LONG_SLOTS

    def outstanding(self) -> int:
        names = (self.queue.name, LONG_QUEUE, URGENT_QUEUE)
        with self.admin.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.zcard(self.queue._incomplete.replace(self.queue.name, name, 1))
            return sum(int(x) for x in pipe.execute())

    def worker_argv(self, priority: bool = False) -> list[str]:
        return worker_command(__name__, self.url)

    pool = (
        "`saq bench.peers.saq.pool_settings --workers N`: one worker in the main process and "
        "N - 1 forked ones, concurrency=10 each"
    )

    def pool_argv(self, processes: int) -> list[str]:
        return worker_command(__name__, self.url, processes=processes)

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


async def _split(url: str) -> None:
    """Two workers in one process, stopped together on SIGTERM."""
    workers = [
        Worker(Queue.from_url(url, name=LONG_QUEUE), functions=[long], concurrency=LONG_SLOTS),
        Worker(Queue.from_url(url, name=URGENT_QUEUE), functions=[urgent],
               concurrency=URGENT_SLOTS),
    ]  # fmt: skip
    for w in workers:
        w.SIGNALS = []  # one handler for both, below
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runs = [asyncio.ensure_future(w.start()) for w in workers]
    started = Started()
    await stop.wait()
    await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
    await asyncio.gather(*runs, return_exceptions=True)
    started.report()


POOL_URL_ENV = "BENCH_SAQ_URL"


def pool_settings() -> dict[str, Any]:
    """The settings `saq` loads in each worker process of ``--workers N``."""
    return {"queue": Queue.from_url(os.environ[POOL_URL_ENV]), "functions": [noop, stamped]}


def _pool(url: str, processes: int) -> None:
    """``saq bench.peers.saq.pool_settings --workers N`` (`saq.runner.run`) in this process. On
    SIGTERM its main worker stops; the forked ones get it too, as from a process-group signal
    (systemd's default), sent here."""
    from saq.runner import run

    os.environ[POOL_URL_ENV] = url
    started = Started()
    with contextlib.suppress(SystemExit):
        run(f"{__name__}.pool_settings", workers=processes, quiet=True)
    for child in multiprocessing.active_children():
        if child.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
        child.join(20)
    started.report()


def worker_main(url: str, options: dict[str, Any]) -> None:
    if options.get("processes"):
        _pool(url, int(options["processes"]))
        return
    if options.get("split"):
        asyncio.run(_split(url))
        return
    asyncio.run(_worker(url))
