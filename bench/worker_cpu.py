"""What a worker process spends on a schedule's run, in instructions (valgrind): a figure that
does not move with the host's load, for changes to the worker of a few per cent.

    python -m bench.worker_cpu [--n 20000] [--runs 1000,5000] [--concurrency 300]
                               [--repeat 1] [--keep DIR]

Starts a private redis-server, registers ``--n`` schedules (``App.schedule_many``, every day, an
async no-op task), makes twice as many of them due now as the worker is to settle (their
entries moved into slots a second in the past, 20 a slot: 100,000 schedules every 5 s in 1-ms
slots), then runs one worker process (`drumbeat.run_worker`, ``--concurrency`` slots) under
``valgrind --tool=callgrind`` with ``--max-jobs`` of that many runs, and counts the runs it
settled from the schedules. It does this for each count of ``--runs`` on a fresh Redis; the
instructions per run are the slope between the two, so the process's start-up and shut-down
drop out. Every run the worker claims is due already, so its claims are full: the saturated
regime of `bench.periodic`, where the worker is the larger CPU consumer. Python runs about 50
times slower under valgrind: each count takes a minute or so. ``--keep DIR`` keeps each dump
(``callgrind_annotate --inclusive=yes DIR/worker-<runs>.callgrind``: where the interpreter's
instructions go, e.g. the garbage collector's ``gc_collect_main``). ``PYTHONHASHSEED`` is
fixed, so a repeat gives the same figure within a fraction of a per cent; compare trees by
running each (``PYTHONPATH``) with the same arguments: the figure depends on the two counts
(claims and settles of other sizes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from ._redis import RedisServer
from .machine import cpu_model
from .redis_cpu import _register

NAMESPACE = "wcpu"
TASK = "bench.worker_cpu.noop"
_CHILD = "bench.worker_cpu"


async def noop(i: int) -> None:
    """The task every schedule runs."""


def _child(url: str, runs: int, concurrency: int) -> None:
    """The worker process, as `drumbeat worker` runs it: it retires once ``runs`` are settled
    (``--max-jobs``; a few more may end before it notices), finishing what it holds."""
    import drumbeat
    from drumbeat.worker.recycling import Budget

    app = drumbeat.App(url, namespace=NAMESPACE)
    app.task(name=TASK)(noop)
    drumbeat.run_worker(app, concurrency=concurrency, budget=Budget(max_jobs=runs))


def _make_due(client: redis.Redis, due: int, at_ms: int) -> int:
    """The entries of s0..s<due - 1> move into slots a second in the past, 20 a slot (100,000
    schedules every 5 s in 1-ms slots), the others stay where they are (a day away)."""
    from drumbeat.keys import Keys

    keys = Keys(NAMESPACE)
    moved: list[tuple[str, str]] = []
    for ms in client.zrange(keys.slots, 0, -1):
        kept = []
        for e in client.lrange(keys.slot(int(ms)), 0, -1):
            sid = e.decode().partition("|")[0]
            (moved if int(sid[1:]) < due else kept).append((sid, e.decode()))
        client.delete(keys.slot(int(ms)))
        if kept:
            client.rpush(keys.slot(int(ms)), *(e for _, e in kept))
        else:
            client.zrem(keys.slots, ms)
    moved.sort(key=lambda m: int(m[0][1:]))
    pipe = client.pipeline(transaction=False)
    for i, (sid, entry) in enumerate(moved):
        slot = at_ms - 1000 + i // 20
        pipe.rpush(keys.slot(slot), entry)
        pipe.zadd(keys.slots, {str(slot): slot})
        pipe.hset(keys.where, sid, slot)
    pipe.execute()
    return len(moved)


def _left(client: redis.Redis, since_ms: int) -> int:
    """Runs not settled: entries still waiting in slots at or before ``since_ms``."""
    from drumbeat.keys import Keys

    keys = Keys(NAMESPACE)
    slots = client.zrangebyscore(keys.slots, "-inf", since_ms)
    return sum(client.llen(keys.slot(int(ms))) for ms in slots)


def _instructions(n: int, runs: int, concurrency: int, keep: Path | None) -> tuple[int, int]:
    """(instructions, runs settled) of a worker process told to settle ``runs``."""
    with RedisServer() as server, server.client() as client:
        _register(server.url, n, namespace=NAMESPACE, task=TASK, every=86_400).close()
        now = int(client.time()[0]) * 1000
        # More due than asked for: the worker never runs short of due runs before it retires.
        due = _make_due(client, min(n, runs * 2), now)
        out = Path(tempfile.mkdtemp(prefix="drumbeat-worker-cpu-"))
        dump = out / "worker.callgrind"
        try:
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={dump}",
                 sys.executable, "-m", _CHILD, "--child", server.url, str(runs),
                 str(concurrency)],
                check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            totals = [ln for ln in dump.read_text().splitlines() if ln.startswith("totals:")]
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(dump, keep / f"worker-{runs}.callgrind")
            settled = due - _left(client, now)
            return int(totals[-1].split()[1]), settled
        finally:
            shutil.rmtree(out, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.worker_cpu", description=__doc__.split("\n")[0]
    )
    p.add_argument("--n", type=int, default=20_000, help="schedules registered")
    p.add_argument("--runs", default="1000,5000", help="two run counts, the slope between them")
    p.add_argument("--concurrency", type=int, default=300)
    p.add_argument("--repeat", type=int, default=1, help="median of this many slopes")
    p.add_argument("--keep", type=Path, metavar="DIR", help="keep the callgrind dumps here")
    p.add_argument(
        "--child", nargs=3, metavar=("URL", "RUNS", "CONCURRENCY"), help=argparse.SUPPRESS
    )
    args = p.parse_args(argv)
    if args.child:
        url, runs, concurrency = args.child
        _child(url, int(runs), int(concurrency))
        return 0
    low, high = (int(x) for x in args.runs.split(","))
    if not 0 < low < high <= args.n // 2:
        p.error("--runs needs two counts, 0 < low < high <= --n / 2")
    if shutil.which("valgrind") is None:
        p.error("valgrind is missing (Debian: apt-get install valgrind)")
    print(f"$ python -m bench.worker_cpu --n {args.n} --runs {low},{high} "
          f"--concurrency {args.concurrency} --repeat {args.repeat}")  # fmt: skip
    print(f"CPU: {cpu_model()}; Python {sys.version.split()[0]}")
    slopes = []
    for _ in range(args.repeat):
        started = time.monotonic()
        (a, ran_a), (b, ran_b) = (
            _instructions(args.n, runs, args.concurrency, args.keep) for runs in (low, high)
        )
        slopes.append((b - a) / (ran_b - ran_a))
        print(f"  {a / 1e6:,.1f} M instructions for {ran_a:,} runs, {b / 1e6:,.1f} M for "
              f"{ran_b:,}: {slopes[-1] / 1e3:,.1f} k a run "
              f"({time.monotonic() - started:.0f} s)")  # fmt: skip
    print(f"worker instructions per run (median of {len(slopes)}): "
          f"{statistics.median(slopes) / 1e3:,.1f} k")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
