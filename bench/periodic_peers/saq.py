"""SAQ cron jobs: the SAQ worker itself schedules them (every ``timers["schedule"]`` second it
enqueues, one by one, the next occurrence of every cron job, deferred to that time; a Lua
script then moves the due ones to the queue) and runs them.

One cron job per schedule. SAQ names a cron job, and keys its uniqueness, by its function's
``__qualname__``, so each schedule gets a function of its own (``s<i>``). SAQ's cron is croniter
with a seconds field and whole-second ``scheduled`` times, so an interval that divides a minute
becomes a set of seconds, and phases are whole seconds. A run's due time is its job's
``scheduled`` (exposed).

    python -m bench.periodic_peers.saq worker --url URL --n N --interval S ...
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ._common import Args, PeerSpec, Recorder, cron_seconds, emit_started, parse_args

SPEC = PeerSpec(
    name="saq",
    module="saq",
    venv="peers",
    roles=("worker",),
    register=False,
    schedules_in_redis=False,
    due_match="exposed",
    due="exposed: the job's scheduled time (whole seconds), ctx['job'].scheduled",
    settings="one saq Worker (Redis queue), concurrency 20 (default 10), "
    "CronJob(s<i>, cron='* * * * * <seconds>', unique=True) per schedule; otherwise defaults "
    "(schedule timer 1 s)",
    packages=("saq", "croniter", "redis", "hiredis"),
    phase_step=1.0,
    interval_divides_minute=True,
    startup_seconds=5.0,
    seconds_per_schedule=100e-6,
)


def worker(args: Args) -> None:
    from saq import CronJob, Queue, Worker

    recorder = Recorder(args.runs_dir, args.role)

    def schedule(i: int) -> Callable[[dict[str, Any]], Awaitable[None]]:
        async def run(ctx: dict[str, Any]) -> None:
            recorder.record(i, float(ctx["job"].scheduled), time.time())

        run.__qualname__ = run.__name__ = f"s{i}"
        return run

    async def on_startup(ctx: dict[str, Any]) -> None:
        emit_started(register_s=registered)

    t0 = time.perf_counter()
    jobs = [
        CronJob(schedule(i), cron="* * * * * " + ",".join(map(str, cron_seconds(args, i))))
        for i in range(args.n)
    ]
    registered = time.perf_counter() - t0

    async def go() -> None:
        queue = Queue.from_url(args.url)
        w = Worker(
            queue, functions=[], cron_jobs=jobs, concurrency=args.concurrency, startup=on_startup
        )
        await w.start()  # SIGTERM stops it

    asyncio.run(go())


def main() -> None:
    worker(parse_args(("worker",)))


if __name__ == "__main__":
    main()
