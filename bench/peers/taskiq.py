"""Taskiq with taskiq-redis's `RedisStreamBroker` (a Redis stream and consumer group, with
acknowledgements), no result backend (the default): one worker process (``taskiq worker
--workers 1``; the default is 2), ``max_async_tasks=100`` (default), ack once the result is
saved (the CLI's default), async no-op tasks."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from taskiq.acks import AcknowledgeType
from taskiq.api import run_receiver_task
from taskiq_redis import RedisStreamBroker

from bench.adapter import SINK, Base, Loop, Started, apaced, versions, worker_command

STREAM = GROUP = "taskiq"
MAX_ASYNC_TASKS = 100


def _declare(url: str) -> tuple[RedisStreamBroker, Any, Any]:
    broker = RedisStreamBroker(url, queue_name=STREAM, consumer_group_name=GROUP)

    @broker.task(task_name="noop")
    async def noop(i: int) -> None:
        SINK.noop()

    @broker.task(task_name="stamped")
    async def stamped(sent_at: float) -> None:
        SINK.stamped(sent_at)

    return broker, noop, stamped


class TaskiqSystem(Base):
    name = "taskiq"
    settings = (
        f"1 process (`taskiq worker --workers 1`), max_async_tasks={MAX_ASYNC_TASKS} (default), "
        "ack when saved (default), RedisStreamBroker, xread_count 100 (default), "
        "async no-op tasks"
    )
    bulk = None
    priority = None  # taskiq's priority label is for brokers that have priorities (RabbitMQ)

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.loop = Loop()
        self.broker, self.noop, self.stamped = _declare(url)
        self.loop.run(self.broker.startup())

    def version(self) -> str:
        return versions("taskiq", "taskiq-redis", "redis", "hiredis")

    def reset(self) -> None:
        super().reset()
        # The consumer group reads from "$": it must exist before the jobs are added.
        self.loop.run(self.broker._declare_consumer_group())

    def enqueue_one_by_one(self, n: int) -> None:
        async def go() -> None:
            kiq = self.noop.kiq
            for i in range(n):
                await kiq(i)

        self.loop.run(go())

    def fill(self, n: int) -> None:
        async def go() -> None:
            for start in range(0, n, 100):
                await asyncio.gather(*(self.noop.kiq(i) for i in range(start, min(n, start + 100))))

        self.loop.run(go())

    def produce_stamped(self, rate: float, n: int) -> float:
        return self.loop.run(apaced(rate, n, self.stamped.kiq))

    def outstanding(self) -> int:
        """Entries not yet delivered to the group (lag) plus those delivered and not acked."""
        for group in self.admin.xinfo_groups(STREAM):
            if group["name"] in (GROUP, GROUP.encode()):
                return int(group["lag"] or 0) + int(group["pending"])
        return 0

    def worker_argv(self, priority: bool = False) -> list[str]:
        return worker_command(__name__, self.url)

    def close(self) -> None:
        self.loop.run(self.broker.shutdown())
        self.loop.close()
        super().close()


async def _worker(url: str) -> None:
    broker, _, _ = _declare(url)
    broker.is_worker_process = True
    await broker.startup()
    receiver = asyncio.create_task(
        run_receiver_task(
            broker, max_async_tasks=MAX_ASYNC_TASKS, ack_time=AcknowledgeType.WHEN_SAVED
        )
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started = Started()
    await stop.wait()
    receiver.cancel()
    await asyncio.gather(receiver, return_exceptions=True)
    await broker.shutdown()
    started.report()


def worker_main(url: str, options: dict[str, Any]) -> None:
    asyncio.run(_worker(url))
