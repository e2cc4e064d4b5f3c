"""Batches, measured (issue 31): what a member of a batch with a callback costs over a plain job,
and how soon the callback starts after the last member ended.

    python -m bench.workflows                 # 10,000 members, 3 rounds, 200 small batches
    python -m bench.workflows --quick         # 2,000 members, 1 round, 50 small batches

A full run takes /tmp/drumbeat-bench.lock as bench.core does (one benchmark at a time).

"Overhead": the same N no-op jobs enqueued, then drained by one worker (in this process, 10
slots), as plain jobs (``enqueue_many``) and as the members of one batch with an
``on_complete`` callback (``app.batch``), alternated, on one private redis-server. Per job:
the Redis server's CPU (``INFO cpu``, user + sys) and its commands (``INFO commandstats``:
those a script runs count, as the work they are), enqueue and drain together; and the drain
rate (jobs/s from the worker's start to the last end); and how long the batch's write (one
MULTI) held Redis. Medians of the rounds.

"Callback latency": batches of 10 members run by a worker at light load, one batch at a time;
from the end of the last member's task function to the start of the callback's (one clock:
the worker runs in this process). p50 / p99 over the batches.

``python -m bench.workflows --peers`` runs issue 31's other figure instead: a callback after
10,000 no-op members in drumbeat (a batch), Celery (a chord, Redis backend) and RQ
(``depends_on``), side by side (bench/workflows_peers.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import sys
import time

import redis

import drumbeat
from bench._redis import RedisServer
from bench.core import _git_revision, bench_lock
from bench.machine import cpu_model
from drumbeat.testing import arun_until_idle


def _redis_counters(r: redis.Redis) -> tuple[float, int]:
    """(CPU s, commands) the server has used so far."""
    cpu = r.info("cpu")
    calls = sum(int(v["calls"]) for v in r.info("commandstats").values())
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), calls


async def _round(url: str, n: int, batched: bool, tag: str) -> dict[str, float]:
    app = drumbeat.App(url, namespace=f"bw{tag}")
    ended: list[float] = []

    @app.task(name="noop")
    async def noop() -> None:
        ended.append(time.perf_counter())

    @app.task(name="after")
    async def after() -> None: ...

    r = redis.Redis.from_url(url)
    cpu0, calls0 = _redis_counters(r)
    members = [noop.prepare() for _ in range(n)]
    if batched:
        exec0 = _exec_us(r)
        batch = await app.abatch(members, on_complete=after.prepare())
        write_ms = (_exec_us(r) - exec0) / 1000
    else:
        await app.aenqueue_many(members)
        write_ms = 0.0
    start = time.perf_counter()
    await arun_until_idle(app, timeout=600)
    drained = max(ended) - start
    cpu1, calls1 = _redis_counters(r)
    if batched:
        assert (await batch.astatus()).succeeded == n
    r.close()
    await app.aclose()
    per = {"cpu_us": (cpu1 - cpu0) * 1e6 / n, "calls": (calls1 - calls0) / n}
    return {**per, "rate": n / drained, "write_ms": write_ms}


def _exec_us(r: redis.Redis) -> int:
    """µs Redis spent in MULTI/EXEC so far (a batch is written in one)."""
    return int(r.info("commandstats").get("cmdstat_exec", {}).get("usec", 0))


async def _latency(url: str, batches: int, size: int) -> list[float]:
    app = drumbeat.App(url, namespace="bwlat")
    last_end: dict[str, float] = {}
    gaps: list[float] = []
    done = asyncio.Event()

    @app.task(name="member")
    async def member() -> None:
        batch = drumbeat.current_job().batch
        assert batch is not None
        last_end[batch.id] = time.perf_counter()

    @app.task(name="callback")
    async def callback() -> None:
        now = time.perf_counter()
        batch = drumbeat.current_job().batch
        assert batch is not None
        gaps.append(now - last_end[batch.id])
        done.set()

    worker = drumbeat.Worker(app, concurrency=size)
    running = asyncio.create_task(worker.run())
    try:
        for _ in range(batches):
            done.clear()
            await app.abatch(
                [member.prepare() for _ in range(size)], on_complete=callback.prepare()
            )
            await asyncio.wait_for(done.wait(), 30)
            await asyncio.sleep(0.01)  # light load: one batch at a time, a pause between
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
        await app.aclose()
    return gaps


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def main(argv: list[str]) -> int:
    if "--peers" in argv:  # drumbeat vs Celery's chord vs RQ's depends_on
        from bench import workflows_peers

        return workflows_peers.main([a for a in argv if a != "--peers"])
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--members", type=int, default=None)
    args = parser.parse_args(argv)
    n = args.members or (2_000 if args.quick else 10_000)
    rounds, small = (1, 50) if args.quick else (3, 200)
    print(f"$ python -m bench.workflows {shlex.join(argv)}".rstrip())
    python = sys.version.split()[0]
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; git {_git_revision()}; Python {python}")
    with bench_lock(not args.quick), RedisServer() as server:
        load = os.getloadavg()
        plain: list[dict[str, float]] = []
        batched: list[dict[str, float]] = []
        for i in range(rounds):  # alternated, so drift hits both alike
            plain.append(await _round(server.url, n, False, f"p{i}"))
            batched.append(await _round(server.url, n, True, f"b{i}"))
        gaps = await _latency(server.url, small, 10)
        version = redis.Redis.from_url(server.url).info("server")["redis_version"]
    print(f"Redis {version}; load average {load[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end")

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    print(f"\n{n:,} no-op jobs, one worker (10 slots), median of {rounds} round(s)")
    print(f"{'':28}{'plain jobs':>14}{'batch members':>16}{'per member':>14}")
    for key, what, unit in (
        ("cpu_us", "Redis CPU per job", "µs"),
        ("calls", "Redis commands per job", ""),
    ):
        p, b = med(plain, key), med(batched, key)
        print(f"{what:28}{p:>12.1f}{unit:>2}{b:>14.1f}{unit:>2}{b - p:>+12.1f}{unit:>2}")
    p, b = med(plain, "rate"), med(batched, "rate")
    print(f"{'drain rate (jobs/s)':28}{p:>14,.0f}{b:>16,.0f}{b / p:>13.0%} of plain")
    print(
        f"the batch's write (one MULTI: enqueue and open_batch) held Redis "
        f"{med(batched, 'write_ms'):.0f} ms"
    )
    ms = [g * 1000 for g in gaps]
    print(
        f"\nlast member's end -> callback start, {small} batches of 10 at light load: "
        f"p50 {_pct(ms, 50):.2f} ms, p99 {_pct(ms, 99):.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
