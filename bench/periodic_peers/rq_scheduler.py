"""rq-scheduler: schedules as RQ jobs in the ``rq:scheduler:scheduled_jobs`` sorted set, moved
to the queue by an ``rqscheduler`` process, run by an RQ ``SimpleWorker``.

``Scheduler.schedule(scheduled_time, func, interval=...)`` stores whole seconds, so phases are
whole seconds too. When it enqueues a periodic job the scheduler re-adds it at ``int(now) +
interval``: the next run is re-based on the scheduler's clock, never on the previous slot.

    python -m bench.periodic_peers.rq_scheduler {register,scheduler,worker} --url URL ...
"""

from __future__ import annotations

import datetime as dt
import time

from ._common import (
    REBASED,
    Args,
    PeerSpec,
    emit_registered,
    emit_started,
    first_due,
    parse_args,
    use_recorder,
)

SPEC = PeerSpec(
    name="rq-scheduler",
    module="rq_scheduler",
    venv="peers",
    roles=("scheduler", "worker"),
    register=True,
    schedules_in_redis=True,
    due_match="sequence",
    due=REBASED,
    settings="rqscheduler polling every 1 s (its default is 60 s), Scheduler.schedule(..., "
    "interval=S, repeat=None) one call per schedule; worker: one RQ SimpleWorker (the default "
    "Worker forks a horse per job), log level WARNING",
    packages=("rq-scheduler", "rq", "redis", "hiredis"),
    phase_step=1.0,
    startup_seconds=5.0,
    seconds_per_schedule=400e-6,
)

QUEUE = "default"
POLL_SECONDS = 1
TASK = "bench.periodic_peers._common.record_run"


def register(args: Args) -> None:
    import redis
    from rq_scheduler import Scheduler

    scheduler = Scheduler(queue_name=QUEUE, connection=redis.Redis.from_url(args.url))
    t0 = time.perf_counter()
    for i in range(args.n):
        at = dt.datetime.fromtimestamp(first_due(args, i, SPEC.phase_step), dt.UTC)
        scheduler.schedule(at, TASK, args=[i], interval=args.interval, repeat=None, id=f"s{i}")
    emit_registered(time.perf_counter() - t0)


def scheduler(args: Args) -> None:
    import redis
    from rq_scheduler import Scheduler
    from rq_scheduler.utils import setup_loghandlers

    setup_loghandlers("WARNING")
    conn = redis.Redis.from_url(args.url)
    s = Scheduler(queue_name=QUEUE, connection=conn, interval=POLL_SECONDS)
    emit_started()
    s.run()


def worker(args: Args) -> None:
    """One RQ SimpleWorker on the queue; a SIGTERM is a warm shutdown after the running job."""
    import redis
    from rq import Queue, SimpleWorker

    use_recorder(args)
    conn = redis.Redis.from_url(args.url)
    w = SimpleWorker([Queue(QUEUE, connection=conn)], connection=conn)
    emit_started()
    w.work(logging_level="WARNING")


def main() -> None:
    args = parse_args(("register", "scheduler", "worker"))
    {"register": register, "scheduler": scheduler, "worker": worker}[args.role](args)


if __name__ == "__main__":
    main()
