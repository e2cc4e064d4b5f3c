"""Taskiq's scheduler with interval schedules, taskiq-redis's stream broker and one worker.

The schedules are labels of one task (``schedule=[{"interval": S, "args": [i]}, ...]``, read by
``LabelScheduleSource``); the scheduler process checks every schedule once a second and sends
those due. An interval schedule runs first on the scheduler's first tick, so Taskiq picks the
phases (all the same) and does not tell a run's due time: runs are matched on a grid from each
schedule's first run (``first-run``), and lateness is counted from its earliest run on it.

    python -m bench.periodic_peers.taskiq {scheduler,worker} --url URL --n N --interval S ...
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

from ._common import Args, PeerSpec, Recorder, emit_started, parse_args

SPEC = PeerSpec(
    name="taskiq",
    module="taskiq",
    venv="peers",
    roles=("worker", "scheduler"),
    register=False,
    schedules_in_redis=False,
    due_match="first-run",
    due="not exposed, and the phases are Taskiq's (every interval schedule starts on the "
    "scheduler's first tick): the k-th run is matched to the first run + k * interval, "
    "lateness counted from the schedule's earliest run on that grid",
    settings="TaskiqScheduler with LabelScheduleSource (one task, a schedule label "
    "{'interval': S, 'args': [i]} per schedule), run_scheduler_task defaults (1 s loop); "
    "worker: RedisStreamBroker receiver, max_async_tasks 20 (default 100)",
    packages=("taskiq", "taskiq-redis", "redis", "hiredis"),
    startup_seconds=5.0,
    seconds_per_schedule=100e-6,
)


def _broker(args: Args, recorder: Recorder | None) -> Any:
    from taskiq_redis import RedisStreamBroker

    broker = RedisStreamBroker(args.url, queue_name="taskiq", consumer_group_name="taskiq")
    schedules = [{"interval": round(args.interval), "args": [i]} for i in range(args.n)]

    @broker.task(task_name="tick", schedule=schedules)
    async def tick(i: int) -> None:
        if recorder is not None:
            recorder.record(i, float("nan"), time.time())

    return broker


async def _until_sigterm() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


async def _scheduler(args: Args) -> None:
    from taskiq import TaskiqScheduler
    from taskiq.api import run_scheduler_task
    from taskiq.schedule_sources import LabelScheduleSource

    broker = _broker(args, None)
    await broker.startup()
    scheduler = TaskiqScheduler(broker, sources=[LabelScheduleSource(broker)])
    loop = asyncio.create_task(run_scheduler_task(scheduler))
    emit_started()
    await _until_sigterm()
    loop.cancel()


async def _worker(args: Args) -> None:
    from taskiq.acks import AcknowledgeType
    from taskiq.api import run_receiver_task

    broker = _broker(args, Recorder(args.runs_dir, args.role))
    broker.is_worker_process = True
    await broker.startup()
    receiver = asyncio.create_task(
        run_receiver_task(
            broker, max_async_tasks=args.concurrency, ack_time=AcknowledgeType.WHEN_SAVED
        )
    )
    emit_started()
    await _until_sigterm()
    receiver.cancel()


def main() -> None:
    args = parse_args(("scheduler", "worker"))
    asyncio.run(_scheduler(args) if args.role == "scheduler" else _worker(args))


if __name__ == "__main__":
    main()
