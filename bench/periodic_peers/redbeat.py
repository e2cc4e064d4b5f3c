"""RedBeat: Celery beat with its schedule in Redis (``celery-redbeat``), and a Celery worker.

Entries are saved with ``RedBeatSchedulerEntry(...).save()`` (the documented way to add
schedules at run time), each with ``last_run_at`` one interval before its first due time. Beat
then reads due entries from RedBeat's sorted set every tick. Due times are not exposed (as for
Celery beat); the worker is `celery_beat`'s.

    python -m bench.periodic_peers.redbeat {register,beat,worker} --url URL --n N ...
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from . import celery_beat
from ._common import REBASED, Args, PeerSpec, emit_registered, emit_started, first_due, parse_args

SPEC = PeerSpec(
    name="redbeat",
    module="redbeat",
    venv="peers",
    roles=("beat", "worker"),
    register=True,
    schedules_in_redis=True,
    due_match="sequence",
    due=REBASED,
    settings="beat: redbeat.RedBeatScheduler (default lock, key prefix and loop interval), "
    "entries saved one by one with RedBeatSchedulerEntry.save(); worker as for celery-beat",
    packages=("celery-redbeat", "celery", "kombu", "redis", "hiredis"),
    startup_seconds=8.0,
    seconds_per_schedule=400e-6,
)


def make_app(args: Args) -> Any:
    app = celery_beat.make_app(args)
    app.conf.update(beat_scheduler="redbeat.RedBeatScheduler", redbeat_redis_url=args.url)
    return app


def register(args: Args) -> None:
    from celery.schedules import schedule
    from redbeat import RedBeatSchedulerEntry

    app = make_app(args)
    every = schedule(run_every=dt.timedelta(seconds=args.interval))
    t0 = time.perf_counter()
    for i in range(args.n):
        last = dt.datetime.fromtimestamp(first_due(args, i), dt.UTC) - every.run_every
        entry = RedBeatSchedulerEntry(
            f"s{i}", celery_beat.TASK, every, args=(i,), app=app, last_run_at=last
        )
        entry.save()
    emit_registered(time.perf_counter() - t0)


def beat(args: Args) -> None:
    from celery.signals import beat_init

    app = make_app(args)
    beat_init.connect(lambda sender=None, **kw: emit_started(), weak=False)
    app.Beat(loglevel="WARNING", quiet=True, redirect_stdouts=False).run()


def main() -> None:
    args = parse_args(("register", "beat", "worker"))
    {"register": register, "beat": beat, "worker": celery_beat.worker}[args.role](args)


if __name__ == "__main__":
    main()
