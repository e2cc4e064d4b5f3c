"""arq cron jobs: the arq worker itself schedules them (every poll it enqueues, a second ahead,
each cron job due by then, deferred to its due time) and runs them.

One cron job per schedule, all on the same coroutine under distinct names; an interval that
divides a minute becomes a set of seconds, and the phase within the second is arq's
``microsecond`` option. A run's due time is its job's score (``ctx["score"]``, ms), which arq
sets to the cron slot; the schedule is the name in the job id (``s<i>:<due ms>``).

    python -m bench.periodic_peers.arq worker --url URL --n N --interval S ...
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from ._common import Args, PeerSpec, Recorder, cron_seconds, emit_started, first_due, parse_args

SPEC = PeerSpec(
    name="arq",
    module="arq",
    venv="peers",
    roles=("worker",),
    register=False,
    schedules_in_redis=False,
    due_match="exposed",
    due="exposed: the job's score (the cron slot), ctx['score']",
    settings="one arq worker process, max_jobs 20, a blocking pool of 500 Redis connections "
    "(see the module), "
    "cron(..., second={...}, microsecond=..., "
    "unique=True) per schedule; otherwise defaults (poll_delay 0.5 s, keep_result 3600 s)",
    packages=("arq", "redis", "hiredis"),
    interval_divides_minute=True,
    startup_seconds=5.0,
    seconds_per_schedule=100e-6,
)


POOL_CONNECTIONS = 500


def cron_fields(args: Args, i: int) -> tuple[set[int], int]:
    """arq ``second`` and ``microsecond`` of schedule ``i``'s slots (intervals dividing 60 s)."""
    due = first_due(args, i)
    micro = min(999_999, round((due - math.floor(due)) * 1e6))
    return set(cron_seconds(args, i)), micro


def worker(args: Args) -> None:
    from arq import cron
    from arq.connections import ArqRedis, RedisSettings
    from arq.worker import Worker
    from redis.asyncio import BlockingConnectionPool

    recorder = Recorder(args.runs_dir, args.role)

    async def noop(ctx: dict[str, Any]) -> None:
        name = str(ctx["job_id"]).split(":", 1)[0]
        recorder.record(int(name[1:]), int(ctx["score"]) / 1000, time.time())

    async def on_startup(ctx: dict[str, Any]) -> None:
        emit_started(register_s=registered)

    t0 = time.perf_counter()
    jobs = []
    for i in range(args.n):
        seconds, micro = cron_fields(args, i)
        jobs.append(cron(noop, name=f"s{i}", second=seconds, microsecond=micro, unique=True))
    registered = time.perf_counter() - t0
    asyncio.set_event_loop(asyncio.new_event_loop())  # arq's Worker takes the current loop
    settings = RedisSettings.from_dsn(args.url)
    # arq enqueues every cron job due within the next second at once (asyncio.gather), each on
    # its own connection: redis-py 8 caps an asyncio pool at 100 connections and fails beyond
    # (arq 0.25 was written against redis-py < 6, where the cap was 2**31), and without a cap
    # 10,000 schedules exhaust Redis's 10,000 clients. A blocking pool of 500 makes the rest
    # wait for a connection instead.
    pool = ArqRedis(
        BlockingConnectionPool(host=settings.host, port=settings.port, db=settings.database,
                               max_connections=POOL_CONNECTIONS, timeout=None)
    )  # fmt: skip
    w = Worker(
        functions=[],
        cron_jobs=jobs,
        redis_pool=pool,
        max_jobs=args.concurrency,
        on_startup=on_startup,
        handle_signals=True,
    )
    w.run()


def main() -> None:
    args = parse_args(("worker",))
    worker(args)


if __name__ == "__main__":
    main()
