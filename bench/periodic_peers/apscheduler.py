"""APScheduler 3: an in-process interval scheduler (``BackgroundScheduler``, memory job store,
thread pool executor): nothing durable or shared, the step most people take first.

Each schedule is ``add_job(func, "interval", seconds=S, start_date=<first due>)``; the trigger
keeps every run on the grid ``start_date + k * S``, so a run is matched to the latest grid slot
at or before its start. Defaults otherwise: a run more than ``misfire_grace_time`` (1 s) late is
skipped (counted here through ``EVENT_JOB_MISSED``, not logged), missed runs coalesce, one
instance of a job at a time.

    python -m bench.periodic_peers.apscheduler scheduler --url URL --n N --interval S ...
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

from ._common import Args, PeerSpec, Recorder, emit_started, first_due, parse_args

SPEC = PeerSpec(
    name="apscheduler",
    module="apscheduler",
    venv="peers",
    roles=("scheduler",),
    register=False,
    schedules_in_redis=False,
    due_match="grid",
    due="not exposed; the interval trigger keeps runs on start_date + k * S: latest grid slot "
    "at or before the start",
    settings="BackgroundScheduler, MemoryJobStore, ThreadPoolExecutor(20) (default 10), job "
    "defaults (misfire_grace_time 1 s, coalesce, max_instances 1); its misfire warnings are "
    "silenced (counted instead); no Redis involved",
    packages=("APScheduler", "tzlocal"),
    startup_seconds=5.0,
    seconds_per_schedule=100e-6,
)


def scheduler(args: Args) -> None:
    from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler

    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    recorder = Recorder(args.runs_dir, args.role)
    missed, busy = itertools.count(), itertools.count()

    def noop(i: int) -> None:
        recorder.record(i, float("nan"), time.time())

    def on_event(event: JobEvent) -> None:
        if event.code == EVENT_JOB_MISSED:
            next(missed)
            due = getattr(event, "scheduled_run_time", None)
            if due is not None:
                recorder.record_missed(int(event.job_id[1:]), due.timestamp())
        else:
            next(busy)

    def counters() -> dict[str, int]:
        return {"missed": _peek(missed), "max_instances": _peek(busy)}

    sched = BackgroundScheduler(
        executors={"default": ThreadPoolExecutor(args.concurrency)}, timezone=dt.UTC
    )
    sched.add_listener(on_event, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
    recorder.counters(counters)
    every = dt.timedelta(seconds=args.interval)
    t0 = time.perf_counter()
    for i in range(args.n):
        start = dt.datetime.fromtimestamp(first_due(args, i), dt.UTC)
        sched.add_job(noop, "interval", seconds=every.total_seconds(), start_date=start,
                      args=(i,), id=f"s{i}")  # fmt: skip
    sched.start()
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    emit_started(register_s=time.perf_counter() - t0)
    stop.wait()
    sched.shutdown(wait=False)
    recorder.flush()


def _peek(counter: Any) -> int:
    """The next value an ``itertools.count`` would give, i.e. how often it was advanced."""
    return int(repr(counter)[6:-1])


def main() -> None:
    args = parse_args(("scheduler",))
    scheduler(args)


if __name__ == "__main__":
    main()
