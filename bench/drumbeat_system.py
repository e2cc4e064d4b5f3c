"""The drumbeat adapter: producer side in this process, workers as ``python -m bench._worker``."""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

import drumbeat
from drumbeat.keys import Keys

from .adapter import WorkerProcess

NOOP = "bench.noop"
STAMPED = "bench.stamped"
_REPO = Path(__file__).resolve().parent.parent


@dataclass(slots=True)
class Sink:
    """What a worker's tasks record, in-process."""

    count: int = 0
    latencies: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Tasks:
    noop: drumbeat.Task[[int], Any]
    stamped: drumbeat.Task[[float], Any]


def register(app: drumbeat.App, sink: Sink) -> Tasks:
    """The benchmark's tasks, under fixed names so producer and worker agree on them."""

    async def noop(i: int) -> None:
        sink.count += 1

    async def stamped(sent_at: float) -> None:
        sink.latencies.append(time.time() - sent_at)
        sink.count += 1

    return Tasks(app.task(name=NOOP)(noop), app.task(name=STAMPED)(stamped))


class DrumbeatSystem:
    name = "drumbeat"

    def __init__(self, url: str) -> None:
        self.url = url
        self._admin = redis.Redis.from_url(url, socket_connect_timeout=5)
        self.namespace = ""
        self.app: drumbeat.App | None = None
        self.reset()

    def version(self) -> str:
        return str(drumbeat.__version__)

    def reset(self) -> None:
        if self.app is not None:
            self.app.close()
        self._admin.flushdb()
        self.namespace = "bench" + uuid.uuid4().hex[:8]
        self.keys = Keys(self.namespace)
        self.app = drumbeat.App(self.url, namespace=self.namespace)
        self.tasks = register(self.app, Sink())
        self.app.redis.ping()  # connect (and check the eviction policy) before any timing

    def enqueue_one(self, i: int) -> None:
        self.tasks.noop.enqueue(i)

    def enqueue_bulk(self, n: int) -> None:
        assert self.app is not None
        self.app.enqueue_many([self.tasks.noop.prepare(i) for i in range(n)])

    def enqueue_stamped(self, sent_at: float) -> None:
        self.tasks.stamped.enqueue(sent_at)

    def outstanding(self) -> int:
        with self._admin.pipeline(transaction=False) as pipe:
            pipe.zcard(self.keys.ready)
            pipe.zcard(self.keys.leases)
            pipe.zcard(self.keys.due)
            return sum(int(x) for x in pipe.execute())

    def dead(self) -> int:
        return int(self._admin.zcard(self.keys.dead))

    def server_cpu_seconds(self) -> float | None:
        cpu = self._admin.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    def server_commands(self) -> int | None:
        """Every command Redis ran, those inside Lua scripts included (``INFO commandstats``)."""
        stats = self._admin.info("commandstats")
        return sum(int(v["calls"]) for v in stats.values())

    def server_memory(self) -> int | None:
        return int(self._admin.info("memory")["used_memory"])

    def start_worker(self, concurrency: int) -> WorkerProcess:
        argv = [sys.executable, "-m", "bench._worker", "--url", self.url,
                "--namespace", self.namespace, "--concurrency", str(concurrency)]  # fmt: skip
        return WorkerProcess(argv)

    def close(self) -> None:
        if self.app is not None:
            self.app.close()
        self._admin.close()
