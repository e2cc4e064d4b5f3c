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
LONG_STREAM, URGENT_STREAM = "taskiq-long", "taskiq-urgent"
LONG_SLOTS, URGENT_SLOTS = 3, 1
"""The urgent-behind-long scenario: no priorities on Redis, so the urgent jobs get a stream and a
receiver of their own, in the same process, with one of the 4 slots kept for them."""


def _split_brokers(url: str) -> tuple[RedisStreamBroker, RedisStreamBroker, Any, Any]:
    long_broker = RedisStreamBroker(url, queue_name=LONG_STREAM, consumer_group_name=GROUP)
    urgent_broker = RedisStreamBroker(url, queue_name=URGENT_STREAM, consumer_group_name=GROUP)

    @long_broker.task(task_name="long")
    async def long(units: int, unit_s: float) -> None:
        SINK.long_start()
        for _ in range(units):
            await asyncio.sleep(unit_s)
        SINK.long_end()

    @urgent_broker.task(task_name="urgent")
    async def urgent(sent_at: float) -> None:
        SINK.stamped(sent_at)

    return long_broker, urgent_broker, long, urgent


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
    urgent_long = (
        f"no priorities on Redis, so a stream of their own for the urgent jobs: 1 process "
        f"running two receivers (`{LONG_STREAM}` max_async_tasks={LONG_SLOTS}, `{URGENT_STREAM}` "
        f"max_async_tasks={URGENT_SLOTS}; 4 slots in all), async tasks (units are "
        f"asyncio.sleep); only {LONG_SLOTS} long jobs run at once"
    )

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

    def _split(self) -> tuple[RedisStreamBroker, RedisStreamBroker, Any, Any]:
        if not hasattr(self, "split"):
            self.split = _split_brokers(self.url)
            for broker in self.split[:2]:
                self.loop.run(broker.startup())
        for broker in self.split[:2]:  # the groups read from "$": made before the jobs
            self.loop.run(broker._declare_consumer_group())
        return self.split

    def fill_long(self, n: int, units: int, unit_s: float) -> None:
        _, _, long, _ = self._split()

        async def go() -> None:
            for _ in range(n):
                await long.kiq(units, unit_s)

        self.loop.run(go())

    def produce_urgent(self, rate: float, n: int) -> float:
        return self.loop.run(apaced(rate, n, self.split[3].kiq))

    def urgent_long_workers(self) -> tuple[list[list[str]], int]:
        return [worker_command(__name__, self.url, split=True)], LONG_SLOTS

    def outstanding(self) -> int:
        """Entries not yet delivered to the group (lag) plus those delivered and not acked."""
        total = 0
        for stream in (STREAM, LONG_STREAM, URGENT_STREAM):
            if not self.admin.exists(stream):
                continue
            for group in self.admin.xinfo_groups(stream):
                if group["name"] in (GROUP, GROUP.encode()):
                    total += int(group["lag"] or 0) + int(group["pending"])
        return total

    def worker_argv(self, priority: bool = False) -> list[str]:
        return worker_command(__name__, self.url)

    def close(self) -> None:
        for broker in getattr(self, "split", ())[:2]:
            self.loop.run(broker.shutdown())
        self.loop.run(self.broker.shutdown())
        self.loop.close()
        super().close()


async def _worker(url: str, split: bool) -> None:
    if split:
        long_broker, urgent_broker, _, _ = _split_brokers(url)
        brokers = [(long_broker, LONG_SLOTS), (urgent_broker, URGENT_SLOTS)]
    else:
        brokers = [(_declare(url)[0], MAX_ASYNC_TASKS)]
    for broker, _ in brokers:
        broker.is_worker_process = True
        await broker.startup()
    receivers = [
        asyncio.create_task(
            run_receiver_task(broker, max_async_tasks=slots, ack_time=AcknowledgeType.WHEN_SAVED)
        )
        for broker, slots in brokers
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started = Started()
    await stop.wait()
    for receiver in receivers:
        receiver.cancel()
    await asyncio.gather(*receivers, return_exceptions=True)
    for broker, _ in brokers:
        await broker.shutdown()
    started.report()


def worker_main(url: str, options: dict[str, Any]) -> None:
    asyncio.run(_worker(url, bool(options.get("split"))))
