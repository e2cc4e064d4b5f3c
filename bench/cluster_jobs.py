"""Jobs on a Redis Cluster of 1, 2 and 3 masters, beside one plain redis-server: drain time,
jobs/s and Redis CPU per job, per master, so the step to more machines is a calculation.

    python -m bench.cluster_jobs [--masters 1,2,3] [--jobs 20000] [--shards-per-master 2]
                                 [--workers 2] [--concurrency 50]

For each master count M it starts M ``redis-server --cluster-enabled yes`` nodes on this machine
as `bench.cluster_periodic` does (`tests.cluster.small.SmallCluster`: no replicas, the slots in
M equal ranges), picks a namespace whose J = ``--shards-per-master`` x M job shards land evenly
on the masters (`Keys.job_keys`), and enqueues ``--jobs`` no-op jobs with ``App(url,
job_shards=J).enqueue_many`` calls of at most ``batch_limit`` (500) jobs, a multiple of J of
them: a producer sends each script call's jobs (at most ``batch_limit``) to the next shard in
turn, so every shard gets as many calls (checked from the enqueued ids, `job_ids.job_shard_of`).
Then it runs ``drumbeat worker bench.cluster_jobs_app:app --processes W --concurrency C`` on
the ``redis+cluster://`` URL until every shard's ``ready`` and ``leases`` are empty (polled
every 20 ms, one pipelined round trip per master). The baseline is the same on one plain
redis-server with ``job_shards=1``.

Per master it reports the jobs its shards held (all drained: their shards emptied and the
`metrics` counters count every job complete), its Redis CPU over the drain (``INFO``
used_cpu_user + sys, from the worker's start to the last shard emptied) and that CPU per job,
and the Redis CPU per job of the enqueue; overall, the drain time (from the last look that found
every job waiting to the first that found every shard empty) and jobs/s.

Everything runs on one machine: the masters, the workers and this harness share its cores, so
the drain time and jobs/s are this machine's, not the cluster's. The figure that carries to
real machines is Redis CPU per job on each master: a master with a core of its own carries
about 1,000,000 / (µs per job, drain + enqueue) jobs/s.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.cluster.small import SmallCluster

import drumbeat
from drumbeat.job_ids import job_shard_of
from drumbeat.keys import Keys
from drumbeat.protocol import LEASES_HELD

from ._cluster import Server, commandstats, costliest, cpu_seconds, even_namespace
from ._redis import RedisServer, find_server_binary
from .cluster_jobs_app import TASK
from .machine import cpu_model

APP = "bench.cluster_jobs_app:app"
RESULTS = Path(__file__).resolve().parent / "results"
POLL = 0.02


def batch_sizes(jobs: int, shards: int, most: int) -> list[int]:
    """Sizes of the enqueue calls: a multiple of ``shards`` of them, at most ``most`` jobs each
    (`Settings.batch_limit`: a call of more is split into script calls that go to a shard each,
    so calls of 833 jobs would put 500 on one shard and 333 on the next), as equal as can be."""
    if shards < 1 or most < 1 or jobs < shards:
        raise ValueError(
            f"expected shards >= 1, most >= 1 and at least as many jobs as shards, got {jobs} "
            f"jobs, {shards} shards, most {most}"
        )
    calls = shards * -(-jobs // (shards * most))
    return [jobs // calls + (i < jobs % calls) for i in range(calls)]


def job_namespace(master_of: Callable[[str], int], masters: int, shards: int) -> str:
    """A namespace whose ``shards`` job shards land evenly on ``masters`` masters."""
    return even_namespace(master_of, masters, shards, lambda ns, k: Keys.job_keys(ns, k).ready)


@dataclass
class Case:
    label: str
    masters: int
    namespace: str
    owner: list[int]
    """Per job shard: the index of its master."""
    per_shard: list[int]
    """Per job shard: the jobs enqueued to it (from their ids)."""
    enqueue_s: float
    enqueue_cpu: list[float]
    startup_s: float
    """From the worker command's start to the first claim."""
    drain_s: float
    drain_cpu: list[float]
    emptied_s: list[float]
    """Per job shard: when it emptied, from the first claim."""
    completed: int
    workers_cpu: float
    """CPU seconds of the worker command's processes over the drain (within a look)."""
    processes: int
    commands: list[tuple[str, float, float]]

    @property
    def jobs(self) -> int:
        return sum(self.per_shard)

    def per_master(self, values: Sequence[float]) -> list[float]:
        out = [0.0] * self.masters
        for shard, value in enumerate(values):
            out[self.owner[shard]] += value
        return out


def _noop(i: int) -> None:
    """Enqueueing only needs the task's name; the workers run `cluster_jobs_app.noop`."""


def group_cpu(pgid: int) -> tuple[float, int]:
    """CPU seconds (user + system) of the live processes of a process group, and how many there
    are (the worker command's supervisor and its worker processes: /proc/<pid>/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, found = 0, 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # The command name may hold spaces and parentheses: the fields follow its last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:  # pgrp, the 5th field
            total += int(fields[11]) + int(fields[12])  # utime, stime: the 14th and 15th
            found += 1
    return total / tick, found


def _outstanding(app: drumbeat.App) -> tuple[list[int], int]:
    """Per job shard, its jobs waiting or running (``ready`` + ``leases``); and all waiting."""
    with app.redis.pipeline(transaction=False) as pipe:
        for k in app.job_keys:
            pipe.zcard(k.ready)
            pipe.zcount(k.leases, *LEASES_HELD)
        counts = [int(x) for x in pipe.execute()]
    ready = counts[0::2]
    return [r + leased for r, leased in zip(ready, counts[1::2], strict=True)], sum(ready)


def run_case(
    label: str,
    servers: Sequence[Server],
    *,
    url: str,
    namespace: str,
    owner: list[int],
    args: argparse.Namespace,
) -> Case:
    shards = len(owner)
    app = drumbeat.App(url, namespace=namespace, job_shards=shards)
    worker: subprocess.Popen[bytes] | None = None
    try:
        task = app.task(name=TASK)(_noop)
        app.redis.ping()  # connect (and check the eviction policy) before any timing
        sizes = batch_sizes(args.jobs, shards, app.settings.batch_limit)
        ids: list[str] = []
        cpu0, t0 = cpu_seconds(servers), time.perf_counter()
        for size in sizes:
            lo = len(ids)
            ids += [j.id for j in app.enqueue_many(task.prepare(i) for i in range(lo, lo + size))]
        enqueue_s = time.perf_counter() - t0
        cpu1 = cpu_seconds(servers)
        by_shard = Counter(job_shard_of(i) for i in ids)
        per_shard = [by_shard[k] for k in range(shards)]
        if sum(per_shard) != args.jobs or max(per_shard) - min(per_shard) > len(sizes) // shards:
            raise RuntimeError(
                f"{label}: {args.jobs} jobs in {len(sizes)} enqueue calls landed {per_shard} on "
                f"the {shards} job shards; expected {len(sizes) // shards} calls on each"
            )
        stats0, cpu2 = commandstats(servers), cpu_seconds(servers)
        started = time.perf_counter()
        env = {**os.environ, "DRUMBEAT_REDIS_URL": url, "DRUMBEAT_NAMESPACE": namespace,
               "DRUMBEAT_JOB_SHARDS": str(shards)}  # fmt: skip
        worker = subprocess.Popen(
            [sys.executable, "-m", "drumbeat", "worker", APP, "--processes", str(args.workers),
             "--concurrency", str(args.concurrency), "--log-level", "warning"],
            env=env, start_new_session=True,
        )  # fmt: skip
        first, emptied, workers_cpu0 = _drain(label, app, worker, args.jobs, args.timeout)
        cpu3, stats1 = cpu_seconds(servers), commandstats(servers)
        workers_cpu1, processes = group_cpu(worker.pid)
        completed = _completed(app, args.jobs)
    finally:
        if worker is not None:
            # The supervisor alone: it passes SIGTERM on, and a worker that got a second one
            # would stop at once.
            worker.terminate()
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
        app.close()
    return Case(
        label=label,
        masters=max(owner) + 1,
        namespace=namespace,
        owner=owner,
        per_shard=per_shard,
        enqueue_s=enqueue_s,
        enqueue_cpu=[b - a for a, b in zip(cpu0, cpu1, strict=True)],
        startup_s=first - started,
        drain_s=max(emptied) - first,
        drain_cpu=[b - a for a, b in zip(cpu2, cpu3, strict=True)],
        emptied_s=[e - first for e in emptied],
        completed=completed,
        workers_cpu=workers_cpu1 - workers_cpu0,
        processes=processes,
        commands=costliest(stats0, stats1, args.jobs, top=8),
    )


def _drain(
    label: str, app: drumbeat.App, worker: subprocess.Popen[bytes], jobs: int, timeout: float
) -> tuple[float, list[float], float]:
    """Waits until every job shard is empty. Returns when the drain started (the last look that
    found every job waiting: within a look, POLL, of the first claim), when each shard emptied
    (the first look that found it so), and the workers' CPU seconds at the start."""
    first, unclaimed, workers_cpu0 = time.perf_counter(), True, 0.0
    emptied: list[float | None] = [None] * len(app.job_keys)
    deadline = time.monotonic() + timeout
    while True:
        left, ready = _outstanding(app)
        now = time.perf_counter()
        if unclaimed and ready == jobs:
            first = now
            workers_cpu0, _ = group_cpu(worker.pid)  # their start-up, left out of the drain
        else:
            unclaimed = False
        for k, n in enumerate(left):
            if n == 0 and emptied[k] is None:
                emptied[k] = now
        done = [e for e in emptied if e is not None]
        if len(done) == len(emptied):
            return first, done, workers_cpu0
        if worker.poll() is not None:
            raise RuntimeError(f"{label}: the worker exited with {worker.returncode}, "
                               f"{sum(left)} jobs left ({left} per shard)")  # fmt: skip
        if time.monotonic() > deadline:
            raise RuntimeError(f"{label}: {sum(left)} jobs left ({left} per shard) after "
                               f"{timeout:g} s; expected none (--timeout)")  # fmt: skip
        time.sleep(POLL)


def _completed(app: drumbeat.App, jobs: int) -> int:
    """The jobs the `metrics` counters count complete (the workers send their counts at most
    every 0.5 s, so wait a little for the last ones)."""
    deadline = time.monotonic() + 10
    while True:
        raw: Any = app.redis.hget(app.keys.metrics, f"j|complete|{TASK}")
        n = int(raw or 0)
        if n >= jobs or time.monotonic() > deadline:
            return n
        time.sleep(POLL)


def cluster_case(masters: int, args: argparse.Namespace) -> Case:
    cluster = SmallCluster(find_server_binary(), masters)
    cluster.start()
    try:
        shards = args.shards_per_master * masters
        ns = job_namespace(cluster.master_of, masters, shards)
        owner = [cluster.master_of(Keys.job_keys(ns, k).ready) for k in range(shards)]
        label = f"cluster, {masters} master{'s' if masters > 1 else ''}"
        return run_case(label, cluster.nodes, url=cluster.url, namespace=ns, owner=owner, args=args)
    finally:
        cluster.stop()


def plain_case(args: argparse.Namespace) -> Case:
    with RedisServer() as server:
        label = "plain redis-server"
        return run_case(label, [server], url=server.url, namespace="bench0", owner=[0], args=args)


def _row(c: Case) -> str:
    jobs = c.per_master([float(n) for n in c.per_shard])
    cpu = c.drain_cpu
    pct = ", ".join(f"{x:.2f} s ({100 * x / c.drain_s:.0f} %)" for x in cpu)
    drain_us = ", ".join(f"{1e6 * x / n:.1f}" for x, n in zip(cpu, jobs, strict=True))
    enq_us = ", ".join(f"{1e6 * x / n:.1f}" for x, n in zip(c.enqueue_cpu, jobs, strict=True))
    return (f"| {c.label} | {len(c.per_shard)} | {', '.join(f'{n:,.0f}' for n in jobs)} | "
            f"{c.drain_s:.2f} s | {c.jobs / c.drain_s:,.0f} | {pct} | {drain_us} µs | "
            f"{enq_us} µs | {c.workers_cpu / c.drain_s:.2f} cores, "
            f"{1e6 * c.workers_cpu / c.jobs:.0f} µs |")  # fmt: skip


def _notes(c: Case) -> list[str]:
    emptied = [max(e for e, o in zip(c.emptied_s, c.owner, strict=True) if o == m)
               for m in range(c.masters)]  # fmt: skip
    top = "; ".join(f"{name} {calls:.2f} calls, {us:.1f} µs" for name, calls, us in c.commands)
    return [
        f"- {c.label}: namespace `{c.namespace}`, jobs per job shard {c.per_shard} (shard k on "
        f"master {c.owner}); enqueue {c.enqueue_s:.2f} s ({c.jobs / c.enqueue_s:,.0f} jobs/s); "
        f"worker start to first claim {c.startup_s:.2f} s ({c.processes} processes); each "
        f"master's last shard emptied {', '.join(f'{e:.2f}' for e in emptied)} s after the "
        "first claim; `metrics` counts "
        f"{c.completed:,} of {c.jobs:,} complete",
        f"- {c.label}, per job, the costliest commands of the drain (every master): {top}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--masters", default="1,2,3")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--shards-per-master", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--timeout", type=float, default=600.0, help="most seconds for one drain")
    args = p.parse_args(argv)
    given = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python -m bench.cluster_jobs", *given])
    load0 = os.getloadavg()
    lines = [
        "# Jobs on a Redis Cluster of 1 to N masters and on one redis-server (bench.cluster_jobs)",
        "",
        f"- command: `{command}`",
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores (every Redis, the workers and the harness "
        f"all on it); load average at start {' '.join(f'{x:.2f}' for x in load0)}",
        f"- {args.jobs:,} no-op jobs enqueued (`enqueue_many`, at most `batch_limit` (500) "
        "a call, a multiple of the job shards of them: each call to the next shard), then "
        f"drained by `drumbeat worker {APP} --processes {args.workers} --concurrency "
        f"{args.concurrency}`; {args.shards_per_master} job shards per master on the cluster, "
        "`job_shards=1` on the plain redis-server",
        "- per master, in master order; Redis CPU is INFO used_cpu_user + used_cpu_sys, over the "
        "drain from the worker's start to the last shard emptied; the drain time runs from the "
        "first claim to the last shard emptied (within 20 ms: the bench looks every 20 ms); "
        "jobs/s = jobs / drain time",
        "",
        "| setup | job shards | jobs per master | drain | jobs/s | Redis CPU per master "
        "(% of the drain) | Redis CPU per job, per master: drain | enqueue | workers' CPU over "
        "the drain, per job |",
        "|---|---:|---|---:|---:|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    notes: list[str] = []
    runs: list[Callable[[], Case]] = [lambda: plain_case(args)]
    runs += [functools.partial(cluster_case, int(m), args) for m in args.masters.split(",")]
    for run in runs:
        case = run()
        row = _row(case)
        print(row, flush=True)
        lines.append(row)
        notes += _notes(case)
    load1 = os.getloadavg()
    lines += ["", *notes, f"- load average at end {' '.join(f'{x:.2f}' for x in load1)}"]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"cluster-jobs-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[len(lines) - len(notes) - 2 :]))
    print(f"written: {out.relative_to(RESULTS.parent.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
