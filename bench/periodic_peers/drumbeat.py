"""drumbeat: schedules in Redis (``App.schedule_many``), runs claimed by ordinary workers.

The worker starts first and the schedules are registered while it runs, as they would be on a
live system; drumbeat picks each schedule's phase itself (a stable hash of its id), so the
harness's anchor is not used. A run's due time is ``drumbeat.current_job().due_ms``.

    python -m bench.periodic_peers.drumbeat {register,worker} --url URL --n N --interval S ...
        [--processes N | --autoscale MIN:MAX] [--task-sleep S] [--limited]

With ``--processes``/``--autoscale`` the worker role is ``drumbeat worker
bench.periodic_peers.drumbeat_app:app --processes N`` (a supervisor and its worker processes,
in this process's group); ``--task-sleep`` makes the task await that long after recording its
start (a monitor's I/O). ``--limited``: every schedule ``concurrency_limit=1, limit_by="i"``
and every tenth routed to queue ``other``, which the workers serve too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ._common import (
    RUNS_DIR_ENV,
    SLEEP_ENV,
    Args,
    PeerSpec,
    Recorder,
    emit_registered,
    emit_started,
    parse_args,
)

SPEC = PeerSpec(
    name="drumbeat",
    module="drumbeat",
    venv="main",
    roles=("worker",),
    register=True,
    register_after_start=True,
    own_phases=True,
    schedules_in_redis=True,
    due_match="exposed",
    due="exposed: drumbeat.current_job().due_ms (fixed-rate grid slot)",
    settings="one worker process (drumbeat.Worker, concurrency 20), async no-op task; "
    "schedule_many, fixed rate (default), no misfire grace, 1 schedule shard (defaults)",
    packages=("redis", "hiredis", "msgpack"),
    max_n=1_000_000,
    startup_seconds=3.0,
    seconds_per_schedule=20e-6,
)

NAMESPACE = "bench"
TASK = "bench.periodic.noop"
OTHER = "other"
"""The queue every tenth schedule is routed to with ``--limited``."""
LIMITED_ENV = "BENCH_PERIODIC_LIMITED"
BATCH = 10_000


async def _noop_stub(i: int) -> None:
    """Registration only needs the task's name; the worker registers the real one."""


def _schedule(i: int, interval: float, limited: bool) -> object:
    import drumbeat

    if not limited:
        return drumbeat.Schedule(f"s{i}", TASK, every=interval, args=(i,))
    return drumbeat.Schedule(
        f"s{i}", TASK, every=interval, args=(i,), concurrency_limit=1, limit_by="i",
        queue=OTHER if i % 10 == 0 else None,
    )  # fmt: skip


def register(args: Args, limited: bool = False) -> None:
    import drumbeat

    app = drumbeat.App(args.url, namespace=NAMESPACE)
    app.task(name=TASK)(_noop_stub)  # the producer side knows the task by name, as in the app
    app.redis.ping()
    t0 = time.perf_counter()
    for lo in range(0, args.n, BATCH):
        app.schedule_many(
            _schedule(i, args.interval, limited)  # type: ignore[misc]
            for i in range(lo, min(lo + BATCH, args.n))
        )
    emit_registered(time.perf_counter() - t0)
    app.close()


@dataclass(frozen=True, slots=True)
class Pool:
    """The drumbeat-only options: how the worker role runs, and the task's sleep."""

    processes: int = 0
    autoscale: str = ""
    task_sleep: float = 0.0
    limited: bool = False

    def flags(self) -> list[str]:
        """``drumbeat worker``'s options for this pool (none: one in-process worker)."""
        queues = ["--queues", f"default,{OTHER}"] if self.limited else []
        if self.autoscale:
            return ["--autoscale", self.autoscale, *queues]
        return ["--processes", str(self.processes), *queues] if self.processes else []


def split_args(argv: Sequence[str]) -> tuple[Pool, list[str]]:
    """This peer's own options, and the rest for `_common.parse_args`."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--processes", type=int, default=0)
    p.add_argument("--autoscale", default="")
    p.add_argument("--task-sleep", type=float, default=0.0)
    p.add_argument("--limited", action="store_true")
    own, rest = p.parse_known_args(list(argv))
    return Pool(own.processes, own.autoscale, own.task_sleep, own.limited), rest


def _supervised(args: Args, pool: Pool) -> None:
    """``drumbeat worker APP --processes N`` (or ``--autoscale``) in this process."""
    from drumbeat.cli import cli

    # Before the app module is first imported (by the CLI, below): its `App()` reads the URL
    # from the environment once, and this process is the supervisor, which reads Redis too (an
    # import before this made it start and use the embedded Redis instead of the bench's).
    os.environ.update(
        {
            "DRUMBEAT_REDIS_URL": args.url,
            "DRUMBEAT_NAMESPACE": NAMESPACE,
            RUNS_DIR_ENV: str(args.runs_dir),
            SLEEP_ENV: f"{pool.task_sleep:g}",
        }
    )
    emit_started()
    code = cli(
        [
            "worker",
            APP,
            *pool.flags(),
            "--concurrency",
            str(args.concurrency),
            "--log-level",
            "warning",
        ],
        standalone_mode=False,
    )
    if code:
        sys.exit(code)


APP = "bench.periodic_peers.drumbeat_app:app"


async def _worker(args: Args, pool: Pool) -> None:
    import drumbeat

    app = drumbeat.App(args.url, namespace=NAMESPACE)
    recorder = Recorder(args.runs_dir, args.role)

    @app.task(name=TASK)
    async def noop(i: int) -> None:
        due_ms = drumbeat.current_job().due_ms
        recorder.record(i, due_ms / 1000 if due_ms is not None else float("nan"), time.time())
        if pool.task_sleep:
            await asyncio.sleep(pool.task_sleep)

    queues = ["default", OTHER] if pool.limited else None
    worker = drumbeat.Worker(app, concurrency=args.concurrency, queues=queues)
    worker.install_signal_handlers()
    emit_started()
    await worker.run()
    await app.aclose()
    recorder.flush()


def main() -> None:
    pool, rest = split_args(sys.argv[1:])
    args = parse_args(("register", "worker"), rest)
    if args.role == "register":
        register(args, pool.limited)
    elif pool.flags():
        _supervised(args, pool)
    else:
        asyncio.run(_worker(args, pool))


if __name__ == "__main__":
    main()
