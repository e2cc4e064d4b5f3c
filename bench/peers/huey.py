"""Huey with `PriorityRedisHuey` (its Redis storage with priorities: a sorted set popped with
BZPOPMIN): one consumer process with one worker thread (``huey_consumer``'s defaults), sync
no-op tasks; SIGTERM is made the graceful signal (``graceful_signal='TERM'``; Huey's default
is SIGINT) so that a stop lets the running task finish."""

from __future__ import annotations

import time
from typing import Any

from huey import PriorityRedisHuey

from bench.adapter import SINK, Base, Started, paced, versions, worker_command

WORKERS = 1
LONG_URGENT: dict[str, Any] = {}
"""The urgent-behind-long scenario's tasks, by name (set by `_declare`)."""
LOW, HIGH = 0, 9
"""Higher first; a task without a priority counts as 0."""


def _declare(url: str) -> tuple[PriorityRedisHuey, Any, Any, Any]:
    huey = PriorityRedisHuey("bench", url=url)

    @huey.task(name="noop")
    def noop(i: int) -> None:
        SINK.noop()

    @huey.task(name="stamped")
    def stamped(sent_at: float) -> None:
        SINK.stamped(sent_at)

    @huey.task(name="high", priority=HIGH)
    def high(i: int) -> None:
        SINK.high()

    @huey.task(name="long")
    def long(units: int, unit_s: float) -> None:
        SINK.long_start()
        for _ in range(units):
            time.sleep(unit_s)
        SINK.long_end()

    @huey.task(name="urgent", priority=HIGH)
    def urgent(sent_at: float) -> None:
        SINK.stamped(sent_at)

    LONG_URGENT.update(long=long, urgent=urgent)
    return huey, noop, stamped, high


class HueySystem(Base):
    name = "huey"
    settings = (
        f"1 process: huey consumer, {WORKERS} worker thread (default workers=1, "
        "worker_type=thread), blocking BZPOPMIN (read_timeout 1 s), sync no-op tasks"
    )
    bulk = None
    priority = f"@huey.task(priority={HIGH}) vs none (= {LOW}); higher first"
    urgent_long = (
        f"1 consumer process, workers=4 threads, urgent task priority={HIGH}, long ones none; no "
        "checkpoints, so an urgent job waits for a free worker thread"
    )

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.huey, self.noop, self.stamped, self.high = _declare(url)

    def version(self) -> str:
        return versions("huey", "redis", "hiredis")

    def enqueue_one_by_one(self, n: int) -> None:
        noop = self.noop
        for i in range(n):
            noop(i)

    def produce_stamped(self, rate: float, n: int) -> float:
        return paced(rate, n, self.stamped)

    def enqueue_high(self, n: int) -> float:
        t0 = time.time()
        for i in range(n):
            self.high(i)
        return t0

    def fill_long(self, n: int, units: int, unit_s: float) -> None:
        for _ in range(n):
            LONG_URGENT["long"](units, unit_s)

    def produce_urgent(self, rate: float, n: int) -> float:
        return paced(rate, n, LONG_URGENT["urgent"])

    def urgent_long_workers(self) -> tuple[list[list[str]], int]:
        return [worker_command(__name__, self.url, workers=4)], 4

    def outstanding(self) -> int:
        """Queued only: Huey keeps no record of the task a worker has popped."""
        return int(self.admin.zcard(self.huey.storage.queue_key))

    def worker_argv(self, priority: bool = False) -> list[str]:
        return worker_command(__name__, self.url)


def worker_main(url: str, options: dict[str, Any]) -> None:
    huey, *_ = _declare(url)
    workers = int(options.get("workers", WORKERS))
    consumer = huey.create_consumer(workers=workers, worker_type="thread", graceful_signal="TERM")
    started = Started()
    consumer.run()
    started.report()
