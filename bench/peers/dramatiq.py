"""Dramatiq with its Redis broker: one worker process with 8 worker threads (``dramatiq``'s
default ``--threads``; its default ``--processes`` is one per core, here one), sync no-op
actors. Idle consumers poll with a backoff of up to ``worker_timeout`` (1 s, the default)."""

from __future__ import annotations

import threading
import time
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.adapter import SINK, Base, Started, on_sigterm, paced, versions, worker_command

THREADS = 8
NAMESPACE = "dramatiq"
QUEUES = ("default", "high")
LOW, HIGH = 10, 0
"""Actor priorities (lower first); they only order the messages a worker has prefetched, so the
high actor also has its own queue, which the worker consumes beside ``default``."""


def _broker(url: str) -> RedisBroker:
    broker = RedisBroker(url=url, namespace=NAMESPACE)
    dramatiq.set_broker(broker)
    return broker


BROKER: RedisBroker | None = None
LONG_URGENT: dict[str, Any] = {}
"""The urgent-behind-long scenario's actors, by name (set by `_declare`)."""


def _declare(url: str) -> tuple[Any, Any, Any]:
    global BROKER  # noqa: PLW0603
    BROKER = _broker(url)

    @dramatiq.actor(actor_name="noop", max_retries=0, priority=LOW)
    def noop(i: int) -> None:
        SINK.noop()

    @dramatiq.actor(actor_name="stamped", max_retries=0)
    def stamped(sent_at: float) -> None:
        SINK.stamped(sent_at)

    @dramatiq.actor(actor_name="high", max_retries=0, priority=HIGH, queue_name="high")
    def high(i: int) -> None:
        SINK.high()

    @dramatiq.actor(actor_name="long", max_retries=0, priority=LOW)
    def long(units: int, unit_s: float) -> None:
        SINK.long_start()
        for _ in range(units):
            time.sleep(unit_s)
        SINK.long_end()

    @dramatiq.actor(actor_name="urgent", max_retries=0, priority=HIGH, queue_name="high")
    def urgent(sent_at: float) -> None:
        SINK.stamped(sent_at)

    LONG_URGENT.update(long=long, urgent=urgent)
    return noop, stamped, high


class DramatiqSystem(Base):
    name = "dramatiq"
    settings = (
        f"1 process (`dramatiq --processes 1`), {THREADS} worker threads (default), prefetch "
        "2 per thread (default), worker_timeout 1 s (default), sync no-op actors"
    )
    bulk = None  # group(...).run() sends the messages one by one
    priority = (
        f"actor priority {HIGH} vs {LOW} (orders a worker's prefetched messages) plus a queue "
        "`high` of its own for the high actor"
    )

    urgent_long = (
        "1 process, 4 worker threads (`--threads 4`), long actor priority 10 on `default`, "
        "urgent actor priority 0 on a queue `high` of its own; no checkpoints, so an urgent "
        "message waits for a free thread"
    )

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.noop, self.stamped, self.high = _declare(url)

    def version(self) -> str:
        return versions("dramatiq", "redis", "hiredis")

    def enqueue_one_by_one(self, n: int) -> None:
        send = self.noop.send
        for i in range(n):
            send(i)

    def produce_stamped(self, rate: float, n: int) -> float:
        return paced(rate, n, self.stamped.send)

    def enqueue_high(self, n: int) -> float:
        t0 = time.time()
        for i in range(n):
            self.high.send(i)
        return t0

    def fill_long(self, n: int, units: int, unit_s: float) -> None:
        for _ in range(n):
            LONG_URGENT["long"].send(units, unit_s)

    def produce_urgent(self, rate: float, n: int) -> float:
        return paced(rate, n, LONG_URGENT["urgent"].send)

    def urgent_long_workers(self) -> tuple[list[list[str]], int]:
        return [worker_command(__name__, self.url, threads=4)], 4

    def outstanding(self) -> int:
        with self.admin.pipeline(transaction=False) as pipe:
            for q in QUEUES:
                pipe.hlen(f"{NAMESPACE}:{q}.msgs")
                pipe.hlen(f"{NAMESPACE}:{q}.DQ.msgs")
            return sum(int(x) for x in pipe.execute())

    def worker_argv(self, priority: bool = False) -> list[str]:
        return worker_command(__name__, self.url)

    pool = (
        f"`dramatiq bench.peers.dramatiq --processes N --threads {THREADS}`: a main process and "
        f"N forked worker processes of {THREADS} threads each"
    )

    def pool_argv(self, processes: int) -> list[str]:
        return worker_command(__name__, self.url, processes=processes)

    def close(self) -> None:
        if BROKER is not None:
            BROKER.close()
        super().close()


def _pool(url: str, processes: int) -> None:
    """Dramatiq's command line (`dramatiq.cli.main`) in this process; its forked workers find
    the broker `_declare` set."""
    from dramatiq.cli import main, make_argument_parser

    _declare(url)
    args = make_argument_parser().parse_args(
        [__name__, "--processes", str(processes), "--threads", str(THREADS)]
    )
    started = Started()
    code = main(args)
    started.report(exit_code=code)


def worker_main(url: str, options: dict[str, Any]) -> None:
    if options.get("processes"):
        _pool(url, int(options["processes"]))
        return
    _declare(url)
    assert BROKER is not None
    stop = threading.Event()
    on_sigterm(stop.set)
    worker = dramatiq.Worker(BROKER, worker_threads=int(options.get("threads", THREADS)))
    started = Started()
    worker.start()
    while not stop.wait(1):
        pass
    worker.stop()  # running messages finish, prefetched ones are requeued
    started.report()
    BROKER.close()
