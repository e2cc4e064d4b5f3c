"""RQ's own periodic jobs: ``rq.cron.CronScheduler`` (RQ 2.5+; ``rq cron CONFIG``), with an RQ
``SimpleWorker``.

The schedules live in the scheduler process (``CronScheduler.register(func, queue, interval=)``,
as a config file would call it); each is started on its phase with ``CronJob.set_enqueue_time``
(one interval before its first due time). Every pass enqueues all due jobs and re-bases each on
the pass's start time, then saves the whole job list to Redis (for monitoring).

    python -m bench.periodic_peers.rq_cron {scheduler,worker} --url URL --n N --interval S ...
"""

from __future__ import annotations

import datetime as dt
import time

from . import rq_scheduler
from ._common import (
    REBASED,
    Args,
    PeerSpec,
    emit_started,
    first_due,
    parse_args,
    record_run,
)

SPEC = PeerSpec(
    name="rq-cron",
    module="rq_cron",
    venv="peers",
    roles=("scheduler", "worker"),
    register=False,
    schedules_in_redis=False,
    due_match="sequence",
    due=REBASED,
    settings="rq.cron.CronScheduler in one process, register(func, 'default', interval=S) per "
    "schedule, log level WARNING; worker as for rq-scheduler (one SimpleWorker)",
    packages=("rq", "redis", "hiredis"),
    startup_seconds=5.0,
    seconds_per_schedule=100e-6,
)


def scheduler(args: Args) -> None:
    import redis
    from rq.cron import CronScheduler

    cron = CronScheduler(connection=redis.Redis.from_url(args.url), logging_level="WARNING")
    t0 = time.perf_counter()
    every = dt.timedelta(seconds=args.interval)
    for i in range(args.n):
        job = cron.register(
            record_run, rq_scheduler.QUEUE, args=(i,), interval=round(args.interval), name=f"s{i}"
        )
        job.set_enqueue_time(dt.datetime.fromtimestamp(first_due(args, i), dt.UTC) - every)
    emit_started(register_s=time.perf_counter() - t0)
    cron.start()


def main() -> None:
    args = parse_args(("scheduler", "worker"))
    {"scheduler": scheduler, "worker": rq_scheduler.worker}[args.role](args)


if __name__ == "__main__":
    main()
