"""drumbeat: schedules in Redis (``App.schedule_many``), runs claimed by ordinary workers.

The worker starts first and the schedules are registered while it runs, as they would be on a
live system; drumbeat picks each schedule's phase itself (a stable hash of its id), so the
harness's anchor is not used. A run's due time is ``drumbeat.current_job().due_ms``.

    python -m bench.periodic_peers.drumbeat {register,worker} --url URL --n N --interval S ...
"""

from __future__ import annotations

import asyncio
import time

from ._common import Args, PeerSpec, Recorder, emit_registered, emit_started, parse_args

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
BATCH = 10_000


async def _noop_stub(i: int) -> None:
    """Registration only needs the task's name; the worker registers the real one."""


def register(args: Args) -> None:
    import drumbeat

    app = drumbeat.App(args.url, namespace=NAMESPACE)
    app.task(name=TASK)(_noop_stub)  # the producer side knows the task by name, as in the app
    app.redis.ping()
    t0 = time.perf_counter()
    for lo in range(0, args.n, BATCH):
        app.schedule_many(
            drumbeat.Schedule(f"s{i}", TASK, every=args.interval, args=(i,))
            for i in range(lo, min(lo + BATCH, args.n))
        )
    emit_registered(time.perf_counter() - t0)
    app.close()


async def _worker(args: Args) -> None:
    import drumbeat

    app = drumbeat.App(args.url, namespace=NAMESPACE)
    recorder = Recorder(args.runs_dir, args.role)

    @app.task(name=TASK)
    async def noop(i: int) -> None:
        due_ms = drumbeat.current_job().due_ms
        recorder.record(i, due_ms / 1000 if due_ms is not None else float("nan"), time.time())

    worker = drumbeat.Worker(app, concurrency=args.concurrency)
    worker.install_signal_handlers()
    emit_started()
    await worker.run()
    await app.aclose()
    recorder.flush()


def main() -> None:
    args = parse_args(("register", "worker"))
    if args.role == "register":
        register(args)
    else:
        asyncio.run(_worker(args))


if __name__ == "__main__":
    main()
