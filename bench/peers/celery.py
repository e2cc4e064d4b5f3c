"""Celery with its Redis broker (kombu), no result backend (Celery's default), and the ``solo``
pool: tasks run in the worker process itself, one at a time (the default ``prefork`` pool would
fork child processes; the rule here is one process per worker)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from celery import Celery

from bench.adapter import SINK, Base, Started, paced, versions, worker_command

QUEUE = "celery"
LOW, HIGH = 9, 0
"""With the Redis broker a lower number is served first, and a message without a priority
counts as 0, the highest; so the low jobs are sent with 9."""
PRIORITY_STEPS = [0, 3, 6, 9]
"""kombu's default: four lists per queue, ``celery``, ``celery\\x06\\x163``, ..."""
SEP = "\x06\x16"

app = Celery("bench", set_as_current=True)
app.conf.update(
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_default_queue=QUEUE,
)


@app.task(name="bench.noop")
def noop(i: int) -> None:
    SINK.noop()


@app.task(name="bench.stamped")
def stamped(sent_at: float) -> None:
    SINK.stamped(sent_at)


@app.task(name="bench.high")
def high(i: int) -> None:
    SINK.high()


@app.task(name="bench.long")
def long(units: int, unit_s: float) -> None:
    SINK.long_start()
    for _ in range(units):
        time.sleep(unit_s)
    SINK.long_end()


@app.task(name="bench.urgent")
def urgent(sent_at: float) -> None:
    SINK.stamped(sent_at)


def _configure(url: str) -> None:
    app.conf.broker_url = url


class CelerySystem(Base):
    name = "celery"
    settings = (
        "1 process: `celery worker --pool=solo --concurrency=1`, prefetch multiplier 4 (default), "
        "early ack (default), mingle/gossip/heartbeat on (default), sync no-op tasks"
    )
    bulk = "kombu Producer.batch() around apply_async (buffered LPUSHes, kombu 5.7)"
    priority = (
        f"apply_async(priority={HIGH}) vs {LOW}: the Redis broker keeps a list per priority "
        "step (0, 3, 6, 9; lower first) and BRPOPs them in order"
    )

    urgent_long = (
        "1 process: `celery worker --pool=threads --concurrency=4 --prefetch-multiplier=1` "
        "(Celery's advice for long tasks: prefetch 1), long jobs sent with priority 9, urgent "
        "with 0 (the Redis broker's priority lists); no checkpoints, so an urgent job waits "
        "for a free slot"
    )

    def __init__(self, url: str) -> None:
        super().__init__(url)
        _configure(url)

    def version(self) -> str:
        return versions("celery", "kombu", "redis", "hiredis")

    def enqueue_one_by_one(self, n: int) -> None:
        delay = noop.delay
        for i in range(n):
            delay(i)

    def _batch(self, n: int, **options: Any) -> None:
        with app.producer_or_acquire() as producer, producer.batch():
            for i in range(n):
                noop.apply_async((i,), producer=producer, **options)

    def enqueue_bulk(self, n: int) -> None:
        self._batch(n)

    def fill_low(self, n: int) -> None:
        self._batch(n, priority=LOW)

    def produce_stamped(self, rate: float, n: int) -> float:
        return paced(rate, n, stamped.delay)

    def enqueue_high(self, n: int) -> float:
        t0 = time.time()
        for i in range(n):
            high.apply_async((i,), priority=HIGH)
        return t0

    def fill_long(self, n: int, units: int, unit_s: float) -> None:
        for _ in range(n):
            long.apply_async((units, unit_s), priority=LOW)

    def produce_urgent(self, rate: float, n: int) -> float:
        return paced(rate, n, lambda t: urgent.apply_async((t,), priority=HIGH))

    def urgent_long_workers(self) -> tuple[list[list[str]], int]:
        return [worker_command(__name__, self.url, pool="threads", concurrency=4)], 4

    def outstanding(self) -> int:
        with self.admin.pipeline(transaction=False) as pipe:
            for step in PRIORITY_STEPS:
                pipe.llen(f"{QUEUE}{SEP}{step}" if step else QUEUE)
            pipe.hlen("unacked")
            return sum(int(x) for x in pipe.execute())

    def worker_argv(self, priority: bool = False) -> list[str]:
        return worker_command(__name__, self.url)

    pool = (
        "`celery worker --pool=prefork --concurrency=N` (Celery's default pool: a master that "
        "consumes and N forked children), prefetch multiplier 4 (default)"
    )

    def pool_argv(self, processes: int) -> list[str]:
        return worker_command(__name__, self.url, pool="prefork", concurrency=processes)

    def close(self) -> None:
        app.close()
        super().close()


def worker_main(url: str, options: dict[str, Any]) -> None:
    _configure(url)
    started = Started()
    # SIGTERM: Celery's warm shutdown (finish the running task, requeue the prefetched ones)
    pool, concurrency = options.get("pool", "solo"), int(options.get("concurrency", 1))
    # threads for long tasks: Celery's advice, prefetch 1; prefork keeps the default
    prefetch = ["--prefetch-multiplier=1"] if pool == "threads" else []
    with contextlib.suppress(SystemExit):
        app.worker_main(["--quiet", "worker", f"--pool={pool}", f"--concurrency={concurrency}",
                         *prefetch, "--loglevel=WARNING"])  # fmt: skip
    started.report()
