"""streaq cron jobs: every streaq worker keeps the cron registry in Redis (a sorted set of job
names by next run time); when one is due, a worker's scheduling pass enqueues its run to the
stream and sets its next time.

One cron job per schedule (``name="s<i>"``). streaq's crontab (parse-crontab) has a seconds
field, so an interval that divides a minute becomes a set of seconds and phases are whole
seconds. A run's due time is not exposed (its task id is a hash of the name and the time), but
runs keep to the crontab's grid, so a run is matched to the latest slot at or before its start.

    python -m bench.periodic_peers.streaq worker --url URL --n N --interval S ...
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from ._common import Args, PeerSpec, Recorder, cron_seconds, emit_started, parse_args

SPEC = PeerSpec(
    name="streaq",
    module="streaq",
    venv="peers",
    roles=("worker",),
    register=False,
    schedules_in_redis=True,
    due_match="grid",
    due="not exposed; cron runs keep to the crontab's grid: latest slot at or before the start",
    settings="one streaq Worker, concurrency 20 (default 16), "
    "worker.cron('<seconds> * * * * * *', name='s<i>') per schedule; otherwise defaults "
    "(unique, timeout 1 h)",
    packages=("streaq", "coredis", "crontab"),
    phase_step=1.0,
    interval_divides_minute=True,
    startup_seconds=5.0,
    seconds_per_schedule=200e-6,
)


def worker(args: Args) -> None:
    from streaq import Worker

    recorder = Recorder(args.runs_dir, args.role)
    w: Worker[Any] = Worker(redis_url=args.url, concurrency=args.concurrency)

    def schedule(i: int) -> None:
        async def run() -> None:
            recorder.record(i, math.nan, time.time())

        w.cron(",".join(map(str, cron_seconds(args, i))) + " * * * * * *", name=f"s{i}")(run)

    t0 = time.perf_counter()
    for i in range(args.n):
        schedule(i)
    registered = time.perf_counter() - t0

    async def announce() -> None:
        # streaq writes its cron registry to Redis as the worker starts: report "started" once
        # every schedule is there, so the Redis memory measured then includes them
        from redis.asyncio import Redis

        async with Redis.from_url(args.url) as client:
            while await client.zcard(w.cron_schedule_key) < args.n:
                await asyncio.sleep(0.05)
        emit_started(register_s=registered)

    async def go() -> None:
        waiting = asyncio.create_task(announce())
        await w.run_async()  # SIGTERM stops it
        waiting.cancel()

    asyncio.run(go())


def main() -> None:
    worker(parse_args(("worker",)))


if __name__ == "__main__":
    main()
