"""Celery beat (its default PersistentScheduler, the schedule in ``beat_schedule``) with a
Celery worker on the Redis broker.

Beat sends each due entry as a task message; a worker runs ``bench.noop(i)``, which records the
run. Celery does not tell a task which due time it was sent for: the harness matches each run
to the latest nominal due time. Each entry's phase is set through its ``last_run_at`` (first due
= last_run_at + interval); after that beat re-bases an entry on the time it sent it.

    python -m bench.periodic_peers.celery_beat {beat,worker} --url URL --n N --interval S ...
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from ._common import REBASED, Args, PeerSpec, Recorder, emit_started, first_due, parse_args

SPEC = PeerSpec(
    name="celery-beat",
    module="celery_beat",
    venv="peers",
    roles=("beat", "worker"),
    register=False,
    schedules_in_redis=False,
    due_match="sequence",
    due=REBASED,
    settings="beat: default PersistentScheduler, schedule in beat_schedule (last_run_at sets "
    "the phase); worker: default prefork pool, concurrency 2 (= cores), prefetch 4; Redis "
    "broker, no result backend, log level WARNING",
    packages=("celery", "kombu", "redis", "hiredis"),
    startup_seconds=8.0,
    seconds_per_schedule=100e-6,
)

TASK = "bench.noop"
WORKER_CONCURRENCY = 2


def make_app(args: Args) -> Any:
    from celery import Celery

    app = Celery("bench", broker=args.url)
    app.conf.update(
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        timezone="UTC",
        enable_utc=True,
    )
    recorder = Recorder(args.runs_dir, args.role)

    @app.task(name=TASK)  # type: ignore[untyped-decorator]
    def noop(i: int) -> None:
        recorder.record(i, float("nan"), time.time())

    return app


def beat_schedule(args: Args, step: float = 0.0) -> dict[str, dict[str, Any]]:
    """Every entry with its ``last_run_at`` one interval before its first due time."""
    every = dt.timedelta(seconds=args.interval)
    return {
        f"s{i}": {
            "task": TASK,
            "schedule": every,
            "args": (i,),
            "last_run_at": dt.datetime.fromtimestamp(first_due(args, i, step), dt.UTC) - every,
        }
        for i in range(args.n)
    }


def beat(args: Args) -> None:
    from celery.signals import beat_init

    app = make_app(args)
    app.conf.beat_schedule = beat_schedule(args)
    beat_init.connect(lambda sender=None, **kw: emit_started(), weak=False)
    app.Beat(
        loglevel="WARNING",
        schedule=str(args.runs_dir / "celerybeat-schedule"),
        quiet=True,
        redirect_stdouts=False,
    ).run()


def worker(args: Args) -> None:
    from celery.signals import worker_ready

    app = make_app(args)
    worker_ready.connect(lambda sender=None, **kw: emit_started(), weak=False)
    app.worker_main(
        ["worker", "--loglevel=WARNING", "--pool=prefork",
         f"--concurrency={WORKER_CONCURRENCY}", "--hostname=bench@%h"]
    )  # fmt: skip


def main() -> None:
    args = parse_args(("beat", "worker"))
    {"beat": beat, "worker": worker}[args.role](args)


if __name__ == "__main__":
    main()
