"""RQ: a `SimpleWorker` (jobs run in the worker process, one at a time) on the queue
``default``; for the priority scenario it listens to ``high`` then ``default``, RQ's documented
way to prioritise (queues are read in the order given)."""

from __future__ import annotations

import time
from typing import Any

import redis
from rq import Queue, SimpleWorker

from bench.adapter import SINK, Base, Started, paced, versions, worker_command


def noop(i: int) -> None:
    SINK.noop()


def stamped(sent_at: float) -> None:
    SINK.stamped(sent_at)


def high(i: int) -> None:
    SINK.high()


def long(units: int, unit_s: float) -> None:
    SINK.long_start()
    for _ in range(units):
        time.sleep(unit_s)
    SINK.long_end()


def urgent(sent_at: float) -> None:
    SINK.stamped(sent_at)


class RQSystem(Base):
    name = "rq"
    settings = (
        "1 process: rq SimpleWorker (runs each job in the worker process, one at a time; the "
        "default `rq worker` forks a work horse per job), sync no-op functions"
    )
    bulk = "Queue.enqueue_many([Queue.prepare_data(...)]) (one pipeline)"
    priority = "a second queue, high: `rq worker high default` reads queues in the order given"
    urgent_long = (
        "4 processes (an RQ worker runs one job at a time, so 4 slots take 4 processes, like "
        "`rq worker-pool -n 4`): SimpleWorkers on `high default`, urgent jobs on `high`; no "
        "checkpoints, so an urgent job waits for a free worker"
    )

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.conn = redis.Redis.from_url(url)
        self.queue = Queue("default", connection=self.conn)
        self.high_queue = Queue("high", connection=self.conn)

    def version(self) -> str:
        return versions("rq", "redis", "hiredis")

    def enqueue_one_by_one(self, n: int) -> None:
        enqueue = self.queue.enqueue
        for i in range(n):
            enqueue(noop, i)

    def enqueue_bulk(self, n: int) -> None:
        self.queue.enqueue_many([Queue.prepare_data(noop, (i,)) for i in range(n)])

    def produce_stamped(self, rate: float, n: int) -> float:
        return paced(rate, n, lambda t: self.queue.enqueue(stamped, t))

    def enqueue_high(self, n: int) -> float:
        t0 = time.time()
        for i in range(n):
            self.high_queue.enqueue(high, i)
        return t0

    def fill_long(self, n: int, units: int, unit_s: float) -> None:
        for _ in range(n):
            self.queue.enqueue(long, units, unit_s, job_timeout=600)

    def produce_urgent(self, rate: float, n: int) -> float:
        return paced(rate, n, lambda t: self.high_queue.enqueue(urgent, t))

    def urgent_long_workers(self) -> tuple[list[list[str]], int]:
        return [self.worker_argv(priority=True)] * 4, 4

    def outstanding(self) -> int:
        with self.admin.pipeline(transaction=False) as pipe:
            for q in (self.queue, self.high_queue):
                pipe.llen(q.key)
                pipe.llen(q.intermediate_queue_key)
                pipe.zcard(q.started_job_registry.key)
            return sum(int(x) for x in pipe.execute())

    def worker_argv(self, priority: bool = False) -> list[str]:
        queues = ["high", "default"] if priority else ["default"]
        return worker_command(__name__, self.url, queues=queues)

    pool = (
        "`rq worker-pool -n N -w rq.worker.SimpleWorker default`: a pool process and N forked "
        "SimpleWorkers (the same worker class as with one process)"
    )

    def pool_argv(self, processes: int) -> list[str]:
        return worker_command(__name__, self.url, queues=["default"], processes=processes)

    def close(self) -> None:
        self.conn.close()
        super().close()


def worker_main(url: str, options: dict[str, Any]) -> None:
    if options.get("processes"):
        from rq.worker_pool import WorkerPool

        pool = WorkerPool(
            options["queues"],
            connection=redis.Redis.from_url(url),
            num_workers=int(options["processes"]),
            worker_class=SimpleWorker,
        )
        started = Started()
        pool.start(logging_level="WARNING")  # SIGTERM: stops every worker, warm
        started.report()
        return
    conn = redis.Redis.from_url(url)
    worker = SimpleWorker([Queue(q, connection=conn) for q in options["queues"]], connection=conn)
    started = Started()
    worker.work(logging_level="WARNING")  # SIGTERM: a warm shutdown after the running job
    started.report()
