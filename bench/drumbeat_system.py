"""The drumbeat adapter: producer side in the harness, workers as
``python -m bench._worker bench.drumbeat_system``."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis

import drumbeat
from drumbeat.keys import Keys
from drumbeat.protocol import LEASES_HELD

from .adapter import SINK, Started, paced, versions, worker_command

NOOP = "bench.noop"
STAMPED = "bench.stamped"
HIGH = "bench.high"
LONG = "bench.long"
URGENT = "bench.urgent"
HIGH_PRIORITY = 9
CONCURRENCY = 10
"""`drumbeat.Settings.concurrency`'s default: the worker's slots."""
LONG_SLOTS = 4
POOL_APP = "bench.drumbeat_pool_app:app"
"""The worker's slots in the urgent-behind-long scenario."""


@dataclass(frozen=True, slots=True)
class Tasks:
    noop: drumbeat.Task[[int], Any]
    stamped: drumbeat.Task[[float], Any]
    high: drumbeat.Task[[int], Any]
    long: drumbeat.Task[[int, float], Any]
    urgent: drumbeat.Task[[float], Any]


def register(app: drumbeat.App) -> Tasks:
    """The benchmark's tasks, under fixed names so producer and worker agree on them."""

    async def noop(i: int) -> None:
        SINK.noop()

    async def stamped(sent_at: float) -> None:
        SINK.stamped(sent_at)

    async def high(i: int) -> None:
        SINK.high()

    def long(units: int, unit_s: float) -> None:
        SINK.long_start()
        for i in range(drumbeat.current_job().progress or 0, units):
            time.sleep(unit_s)
            drumbeat.checkpoint(progress=i + 1)
        SINK.long_end()

    def urgent(sent_at: float) -> None:
        SINK.stamped(sent_at)

    return Tasks(
        app.task(name=NOOP)(noop),
        app.task(name=STAMPED)(stamped),
        app.task(name=HIGH)(high),
        app.task(name=LONG)(long),
        app.task(name=URGENT, priority=HIGH_PRIORITY)(urgent),
    )


class DrumbeatSystem:
    name = "drumbeat"
    settings = (
        f"1 process: asyncio loop, concurrency={CONCURRENCY} (default), async no-op tasks, "
        "claims and settles in batches"
    )
    bulk = "app.enqueue_many([task.prepare(i) ...]) (500 jobs per EVALSHA, pipelined)"
    priority = f"task.options(priority={HIGH_PRIORITY}) vs default 0 (0..9, higher first)"
    urgent_long = (
        f"1 process, concurrency={LONG_SLOTS}, sync tasks; the long jobs (priority 0) call "
        f"drumbeat.checkpoint(progress=...) after each unit, the urgent ones have priority "
        f"{HIGH_PRIORITY}: a checkpoint lends its slot to a waiting urgent job"
    )

    def __init__(self, url: str) -> None:
        self.url = url
        self._admin = redis.Redis.from_url(url, socket_connect_timeout=5)
        self.namespace = ""
        self.app: drumbeat.App | None = None
        self.reset()

    def version(self) -> str:
        return f"drumbeat {drumbeat.__version__} ({versions('redis', 'hiredis')})"

    def reset(self) -> None:
        if self.app is not None:
            self.app.close()
        self._admin.flushdb()
        self.namespace = "bench" + uuid.uuid4().hex[:8]
        self.keys = Keys(self.namespace)
        self.app = drumbeat.App(self.url, namespace=self.namespace)
        self.tasks = register(self.app)
        self.app.redis.ping()  # connect (and check the eviction policy) before any timing

    def enqueue_one_by_one(self, n: int) -> None:
        enqueue = self.tasks.noop.enqueue
        for i in range(n):
            enqueue(i)

    def enqueue_bulk(self, n: int) -> None:
        assert self.app is not None
        self.app.enqueue_many([self.tasks.noop.prepare(i) for i in range(n)])

    def fill(self, n: int) -> None:
        self.enqueue_bulk(n)

    def fill_low(self, n: int) -> None:
        self.enqueue_bulk(n)  # priority 0, the default

    def produce_stamped(self, rate: float, n: int) -> float:
        return paced(rate, n, self.tasks.stamped.enqueue)

    def enqueue_high(self, n: int) -> float:
        bound = self.tasks.high.options(priority=HIGH_PRIORITY)
        t0 = time.time()
        for i in range(n):
            bound.enqueue(i)
        return t0

    def fill_long(self, n: int, units: int, unit_s: float) -> None:
        assert self.app is not None
        self.app.enqueue_many([self.tasks.long.prepare(units, unit_s) for _ in range(n)])

    def produce_urgent(self, rate: float, n: int) -> float:
        return paced(rate, n, self.tasks.urgent.enqueue)

    def urgent_long_workers(self) -> tuple[list[list[str]], int]:
        argv = worker_command(__name__, self.url, namespace=self.namespace, concurrency=LONG_SLOTS)
        return [argv], LONG_SLOTS

    def outstanding(self) -> int:
        with self._admin.pipeline(transaction=False) as pipe:
            pipe.zcard(self.keys.ready)
            pipe.zcount(self.keys.leases, *LEASES_HELD)
            pipe.zcard(self.keys.due)
            return sum(int(x) for x in pipe.execute())

    def worker_argv(self, priority: bool = False) -> list[str]:
        return worker_command(__name__, self.url, namespace=self.namespace, concurrency=CONCURRENCY)

    pool = (
        f"`drumbeat worker {POOL_APP} --processes N --concurrency {CONCURRENCY}`: a supervisor "
        "and N worker processes (fresh interpreters)"
    )

    def pool_argv(self, processes: int) -> list[str]:
        return worker_command(__name__, self.url, namespace=self.namespace,
                              concurrency=CONCURRENCY, processes=processes)  # fmt: skip

    def close(self) -> None:
        if self.app is not None:
            self.app.close()
        self._admin.close()


# -- worker side ---------------------------------------------------------------------------------


async def _worker(url: str, namespace: str, concurrency: int) -> None:
    app = drumbeat.App(url, namespace=namespace)
    register(app)
    worker = drumbeat.Worker(app, concurrency=concurrency)
    worker.install_signal_handlers()
    started = Started()
    await worker.run()
    await app.aclose()
    started.report(processed=worker.processed, failed=worker.failed, worker_id=worker.id)


def _pool(url: str, namespace: str, concurrency: int, processes: int) -> None:
    """``drumbeat worker APP --processes N``, the supported way to run N processes, in this
    process (so the harness sees the supervisor and its workers as this process's tree)."""
    from drumbeat.cli import cli

    os.environ.update(DRUMBEAT_REDIS_URL=url, DRUMBEAT_NAMESPACE=namespace)
    started = Started()
    code = cli(["worker", POOL_APP, "--processes", str(processes), "--concurrency",
                str(concurrency), "--log-level", "warning"], standalone_mode=False)  # fmt: skip
    started.report(exit_code=code)


def worker_main(url: str, options: dict[str, Any]) -> None:
    if options.get("processes"):
        _pool(url, str(options["namespace"]), int(options["concurrency"]),
              int(options["processes"]))  # fmt: skip
        return
    asyncio.run(_worker(url, str(options["namespace"]), int(options["concurrency"])))
