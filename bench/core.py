"""Side-by-side benchmark of drumbeat and the Redis job queues people use today: enqueue rate,
drain throughput, enqueue-to-start latency, priority under load, urgent jobs behind long ones,
and what Redis itself allows, on one private redis-server started for the run.

    python -m bench.core [--quick] [--systems drumbeat,celery,...] [--repeat N] [--jobs N]

Each system is one module (`bench.drumbeat_system`, `bench/peers/<name>.py`) with a `System`
adapter (`bench.adapter`) and its worker side. Every repetition runs each system's scenarios in a
fresh child process (``python -m bench.core --child NAME``; peers from `bench/.venv-peers`, see
`bench.peers_env`), systems back to back, so drumbeat/peer ratios are taken pair by pair.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import importlib
import importlib.util
import json
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from ._redis import RedisServer
from .adapter import (
    HIGH_JOBS_ENV,
    MARKS_KEY,
    MARKS_URL_ENV,
    SINK_DIR_ENV,
    NotSupported,
    ScenarioFailed,
    System,
    WorkerProcess,
    WorkerReport,
    read_sink,
)
from .machine import cpu_model

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
LOCK_PATH = "/tmp/drumbeat-bench.lock"

SYSTEMS: dict[str, str] = {
    "drumbeat": "bench.drumbeat_system:DrumbeatSystem",
    "celery": "bench.peers.celery:CelerySystem",
    "rq": "bench.peers.rq:RQSystem",
    "arq": "bench.peers.arq:ArqSystem",
    "saq": "bench.peers.saq:SaqSystem",
    "dramatiq": "bench.peers.dramatiq:DramatiqSystem",
    "taskiq": "bench.peers.taskiq:TaskiqSystem",
    "huey": "bench.peers.huey:HueySystem",
    "streaq": "bench.peers.streaq:StreaqSystem",
    "floor": "bench.peers.floor:FloorSystem",
}
"""``--systems`` names -> ``module:class``; imported lazily, in the child that runs them."""
BASELINES = ["floor"]
"""Not queues: what a hop through Redis costs on the host (named explicitly, never in 'all')."""
PEERS = [name for name in SYSTEMS if name != "drumbeat" and name not in BASELINES]

Sample = dict[str, float]
"""One repetition of a scenario: metric key -> value (extra keys are kept in the JSON only)."""


@dataclass(frozen=True, slots=True)
class Config:
    jobs: int = 20_000
    repeat: int = 3
    quick: bool = False
    drain_processes: tuple[int, ...] = (1, 2, 4)
    """The drain scenarios' process counts: 1 is the system's one worker process, more run the
    way the system runs several (`drain_pool`)."""
    latency_rate: float = 50.0
    """Jobs per second the latency producer sends."""
    latency_seconds: float = 10.0
    high_jobs: int = 100
    """High-priority jobs sent once a worker is busy with the low ones."""
    high_after: int = 500
    """Low jobs the worker must have taken before the high ones are sent."""
    idle_before: float = 0.5
    """Seconds a ready, idle worker is left alone before the latency producer starts."""
    poll_interval: float = 0.005
    """How often the harness looks at the queue depth while workers drain it: the resolution
    of the drain time (a drain of 20,000 no-op jobs can take under a second)."""
    drain_bound: float = 30.0
    """Seconds a drain may take: a slower system is stopped there and its rate taken over the
    jobs it finished (marked in the report)."""
    long_jobs: int = 4
    """Long low-priority jobs of the urgent-behind-long scenario, one per slot."""
    long_units: int = 400
    """Units of each long job (a checkpoint after each, where the system has them)."""
    unit_seconds: float = 0.01
    urgent_jobs: int = 100
    urgent_rate: float = 20.0
    """Urgent jobs per second, sent once every slot is busy with a long job."""
    ceiling_requests: int = 50_000
    """Requests per command and client setting of the `redis-benchmark` runs."""
    scenarios: tuple[str, ...] = ()
    """Only these scenario keys (empty: all)."""


@dataclass(frozen=True, slots=True)
class Metric:
    key: str
    label: str
    unit: str
    digits: int = 0
    higher_better: bool = True


RATE = Metric("rate", "throughput", "jobs/s")
PRODUCER_CPU = Metric("producer_cpu", "producer CPU", "% of a core")
WORKER_CPU = Metric("worker_cpu", "worker CPU", "% of a core")
REDIS_CPU = Metric("redis_cpu", "Redis CPU", "% of a core")
REDIS_COMMANDS = Metric("redis_commands", "Redis cmds/job", "commands", 1, False)
REDIS_US = Metric("redis_us", "Redis CPU/job", "µs", 1, False)
"""Redis CPU seconds over the span per job: the ceiling of one Redis core is 1e6 / this jobs/s."""
PEAK_RSS = Metric("peak_rss", "worker peak RSS", "MiB", 1, False)
KEPT = Metric("kept_bytes", "Redis bytes kept/job", "bytes", 0, False)
P50 = Metric("p50", "p50", "ms", 2, False)
P99 = Metric("p99", "p99", "ms", 2, False)
MAX = Metric("max", "max", "ms", 2, False)
HIGH_WAIT = Metric("high_wait", "all high started after", "ms", 0, False)
LONG_TOTAL = Metric("long_total", "long jobs' total", "s", 2, False)
LOW_MEANWHILE = Metric("low_meanwhile", "low jobs started meanwhile (approx.)", "jobs", 0, False)


@dataclass(frozen=True, slots=True)
class Scenario:
    key: str
    title: str
    run: Callable[[System, Run], Sample]
    metrics: tuple[Metric, ...]
    ratios: tuple[Metric, ...]
    """Metrics whose drumbeat/peer ratio the report shows."""
    params: Mapping[str, Any] = field(default_factory=dict)
    about: str = ""


@dataclass(slots=True)
class Run:
    """What one repetition of a scenario gets besides the system: settings, its parameters, the
    broker's counters, and a place for notes (worker warnings) that go into the report."""

    cfg: Config
    params: Mapping[str, Any]
    stats: RedisStats
    notes: list[str] = field(default_factory=list)

    def note_stderr(self, reports: Sequence[WorkerReport]) -> None:
        forced = sum(1 for r in reports if r.extra.get("forced"))
        if forced:
            self.notes.append(
                f"{forced} worker(s) did not exit within 20 s of SIGTERM; their counts were "
                "taken on SIGUSR2 and they exited at once"
            )
        for report in reports:
            if report.stderr.strip():
                self.notes.append("a worker wrote to stderr:\n" + _tail(report.stderr))
                return


# -- measuring helpers ---------------------------------------------------------------------------


class RedisStats:
    """The broker's CPU time, command count (those inside Lua scripts included, from
    ``INFO commandstats``) and memory, the same for every system."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, socket_connect_timeout=5)

    def cpu_seconds(self) -> float:
        cpu = self.client.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    def commands(self) -> int:
        return sum(int(v["calls"]) for v in self.client.info("commandstats").values())

    def memory(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def close(self) -> None:
        self.client.close()


class Meter:
    """Wall time, this process's CPU time, and the broker's CPU time and command count over one
    measured span (started on construction)."""

    def __init__(self, stats: RedisStats) -> None:
        self.stats = stats
        self.server_cpu0 = stats.cpu_seconds()
        self.commands0 = stats.commands()
        self.cpu0 = time.process_time()
        self.t0 = time.perf_counter()
        self.t0_wall = time.time()
        self._end: tuple[float, float, float, int] | None = None

    def mark(self) -> None:
        """Ends the span (else `sample` does)."""
        t1, cpu1 = time.perf_counter(), time.process_time()
        self._end = (t1, cpu1, self.stats.cpu_seconds(), self.stats.commands())

    def sample(
        self, jobs: int, elapsed: float | None = None, producer: bool = True
    ) -> tuple[float, Sample]:
        """The span's length (``elapsed`` if given, e.g. timed by a worker) and its metrics."""
        if self._end is None:
            self.mark()
        assert self._end is not None
        t1, cpu1, server_cpu1, commands1 = self._end
        elapsed = t1 - self.t0 if elapsed is None else elapsed
        sample: Sample = {
            REDIS_CPU.key: 100 * (server_cpu1 - self.server_cpu0) / elapsed,
            REDIS_COMMANDS.key: (commands1 - self.commands0) / jobs,
            REDIS_US.key: 1e6 * (server_cpu1 - self.server_cpu0) / jobs,
        }
        if producer:
            sample[PRODUCER_CPU.key] = 100 * (cpu1 - self.cpu0) / elapsed
        return elapsed, sample


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


class Workers:
    """``processes`` worker subprocesses of one system, spawned at once; ``with`` kills any
    left running."""

    def __init__(
        self,
        system: System,
        processes: int,
        cfg: Config,
        priority: bool = False,
        argvs: Sequence[Sequence[str]] = (),
        *,
        sink: str | None = None,
    ) -> None:
        """``argvs``: these command lines, one process each, instead of ``processes`` copies of
        the system's `worker_argv`; ``sink``: a directory where every process that runs jobs
        writes its counts (`bench.adapter.SINK_DIR_ENV`)."""
        env = {**os.environ, HIGH_JOBS_ENV: str(cfg.high_jobs), MARKS_URL_ENV: system.url}
        if sink is not None:
            env[SINK_DIR_ENV] = sink
        argvs = argvs or [system.worker_argv(priority)] * processes
        self.procs = [WorkerProcess(argv, env) for argv in argvs]
        try:
            for proc in self.procs:
                proc.wait_started()
        except BaseException:
            self.kill()
            raise

    def alive(self) -> bool:
        return all(p.alive() for p in self.procs)

    def stop(self, error: str = "") -> list[WorkerReport]:
        reports, failures = [], [error] if error else []
        for proc in self.procs:
            try:
                reports.append(proc.stop())
            except ScenarioFailed as exc:
                failures.append(str(exc))
        if failures:
            ran = sum(r.count for r in reports)
            tails = [_tail(r.stderr) for r in reports if r.stderr.strip()][:1]
            raise ScenarioFailed("; then ".join(failures) + f" (workers ran {ran} jobs)\n"
                                 + "\n".join(tails))  # fmt: skip
        return reports

    def kill(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                for pid in descendants([proc.proc.pid])[1:]:  # a pool's processes too
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            proc.kill()

    def tree(self) -> list[int]:
        """The workers' processes and all their descendants (a pool's children)."""
        return descendants([p.proc.pid for p in self.procs])

    def signal_tree(self, signum: int) -> None:
        _signal(self.tree(), signum)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def _signal(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def descendants(roots: Sequence[int]) -> list[int]:
    """``roots`` and every live process below them, parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (stat := _proc_stat(int(entry.name))) is not None:
            children.setdefault(int(stat[1]), []).append(int(entry.name))
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo += children.get(pid, [])
    return found


_TICK = os.sysconf("SC_CLK_TCK")


def tree_usage(pids: Sequence[int]) -> tuple[float, int]:
    """CPU seconds (user + system, reaped children included) and the sum of the peak resident
    sizes (``VmHWM``, KiB) of these processes."""
    cpu, hwm = 0.0, 0
    for pid in pids:
        stat = _proc_stat(pid)
        if stat is None or stat[0] == "Z":
            continue
        cpu += sum(int(x) for x in stat[11:15]) / _TICK
        with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    hwm += int(line.split()[1])
    return cpu, hwm


class TimeBound(ScenarioFailed):
    """Jobs were still outstanding at a scenario's time bound."""


def wait_drained(system: System, workers: Workers, timeout: float, poll: float) -> float:
    """Poll until nothing is queued or running; returns the wall-clock time it was seen empty."""
    deadline = time.monotonic() + timeout
    while True:
        left = system.outstanding()
        if left == 0:
            return time.time()
        if not workers.alive():
            raise ScenarioFailed(f"a worker exited with {left} jobs still outstanding")
        if time.monotonic() > deadline:
            raise TimeBound(f"{left} jobs still outstanding after {timeout:.0f} s")
        time.sleep(poll)


def drained_reports(
    system: System, workers: Workers, timeout: float, poll: float
) -> tuple[float, list[WorkerReport]]:
    """Wait for an empty queue, then stop the workers: (time seen empty, their reports)."""
    try:
        end = wait_drained(system, workers, timeout, poll)
    except ScenarioFailed as exc:
        workers.stop(str(exc))
        raise
    return end, workers.stop()


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _drain_timeout(jobs: int) -> float:
    return 30 + jobs / 200  # far slower than this is a failure, not a number


def _expect_outstanding(system: System, n: int) -> None:
    found = system.outstanding()
    if found != n:
        raise ScenarioFailed(f"{found} jobs outstanding after enqueueing {n}")


# -- scenarios -----------------------------------------------------------------------------------


def enqueue_one_by_one(system: System, run: Run) -> Sample:
    n = run.cfg.jobs
    meter = Meter(run.stats)
    system.enqueue_one_by_one(n)
    elapsed, sample = meter.sample(n)
    _expect_outstanding(system, n)
    return {RATE.key: n / elapsed, **sample}


def enqueue_bulk(system: System, run: Run) -> Sample:
    if system.bulk is None:
        raise NotSupported("no bulk enqueue")
    n = run.cfg.jobs
    meter = Meter(run.stats)
    system.enqueue_bulk(n)
    elapsed, sample = meter.sample(n)
    _expect_outstanding(system, n)
    return {RATE.key: n / elapsed, **sample}


def _watch_drain(system: System, workers: Workers, cfg: Config, n: int) -> tuple[float, float, int]:
    """Poll the queue until it is empty or the drain bound passes: (time the harness first saw a
    job taken, time it stopped watching, jobs still outstanding then)."""
    deadline = time.monotonic() + cfg.drain_bound
    first_seen = 0.0
    while True:
        left = system.outstanding()
        now = time.time()
        if left < n and not first_seen:
            first_seen = now
        if left == 0 or time.monotonic() > deadline:
            return first_seen or now, now, left
        if not workers.alive():
            raise ScenarioFailed(f"a worker exited with {left} jobs still outstanding")
        time.sleep(cfg.poll_interval)


def drain(system: System, run: Run) -> Sample:
    n, processes, cfg = run.cfg.jobs, int(run.params["processes"]), run.cfg
    if processes > 1:
        return drain_pool(system, run)
    memory0 = run.stats.memory()
    system.fill(n)
    _expect_outstanding(system, n)
    sample: Sample = {}
    with Workers(system, processes, cfg) as workers:
        meter = Meter(run.stats)
        try:
            first_seen, end, left = _watch_drain(system, workers, cfg, n)
        except ScenarioFailed as exc:
            workers.stop(str(exc))
            raise
        meter.mark()
        if left == 0:
            reports = workers.stop()
        else:  # at the bound: the harness counts, as a worker may not stop cleanly then
            try:
                reports = workers.stop()
            except ScenarioFailed as exc:
                reports = []
                run.notes.append(f"after the bound: {exc}")
    done = n - left
    ran = sum(r.count for r in reports)
    if left == 0 and ran != n:
        raise ScenarioFailed(f"the workers ran {ran} jobs; {n} were enqueued")
    starts = [r.first_at for r in reports if r.first_at is not None]
    first = min(starts) if starts else first_seen
    elapsed, sample = meter.sample(max(done, 1), elapsed=end - first, producer=False)
    if reports:
        run.note_stderr(reports)
        if not any(r.extra.get("forced") for r in reports):  # else CPU went on past the end
            sample[WORKER_CPU.key] = 100 * sum(r.cpu_s for r in reports) / elapsed
        sample[PEAK_RSS.key] = sum(r.peak_rss_kb for r in reports) / 1024
        sample["startup_seconds"] = first - min(r.started_at for r in reports)
    if left:
        run.notes.append(f"stopped at the {cfg.drain_bound:.0f} s bound with {done:,} of {n:,} "
                         "jobs done; the rate is over those")  # fmt: skip
    return {
        RATE.key: done / elapsed,
        KEPT.key: (run.stats.memory() - memory0) / max(done, 1),
        "seconds": elapsed,
        "jobs_done": done,
        "bounded": float(left > 0),
        **sample,
    }


def pool_workers(system: System, processes: int, cfg: Config, sink: str) -> Workers:
    """``processes`` worker processes the way the system runs several: its own launcher if it
    has one (`pool_argv`), else that many copies of its one-process worker."""
    pool_argv = getattr(system, "pool_argv", None)
    if pool_argv is not None:
        return Workers(system, 1, cfg, argvs=[pool_argv(processes)], sink=sink)
    return Workers(system, processes, cfg, sink=sink)


def _warm_pool(system: System, workers: Workers, processes: int, sink: str) -> tuple[int, str]:
    """Sends a no-op job every 20 ms until ``processes`` distinct processes have run one (every
    process of the pool is up and claiming), at most `POOL_READY` s; returns the jobs sent and
    a note if fewer processes took part."""
    deadline = time.monotonic() + POOL_READY
    sent = 0
    while len(read_sink(sink)) < processes and time.monotonic() < deadline:
        if not workers.alive():
            raise ScenarioFailed("a worker process exited while the pool started")
        system.fill(1)
        sent += 1
        time.sleep(0.02)
    ran = len(read_sink(sink))
    note = (
        ""
        if ran >= processes
        else (f"only {ran} of {processes} processes had run a job {POOL_READY:g} s after the start")
    )
    return sent, note


def _sink_total(sink: str, expected: int, timeout: float) -> dict[int, dict[str, Any]]:
    """The processes' counts once they add up to ``expected`` (their flushes lag by up to
    `bench.adapter.SINK_FLUSH` s), or as they are after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        counts = read_sink(sink)
        if sum(int(c["count"]) for c in counts.values()) >= expected:
            return counts
        if time.monotonic() > deadline:
            return counts
        time.sleep(0.02)


POOL_READY = 60.0


def drain_pool(system: System, run: Run) -> Sample:
    """The drain with several processes, started the system's way (`pool_workers`). The pool
    starts on an empty queue and runs warm-up jobs until every process has run one; then its
    processes are stopped (SIGSTOP), the jobs queued, and the processes resumed (SIGCONT), the
    drain timed from there: a pool whose processes come up one after another is not timed
    while it starts, and no system drains while it is being filled."""
    n, processes, cfg = run.cfg.jobs, int(run.params["processes"]), run.cfg
    with (
        tempfile.TemporaryDirectory(prefix="drumbeat-bench-sink-") as sink,
        pool_workers(system, processes, cfg, sink) as workers,
    ):
        warm, note = _warm_pool(system, workers, processes, sink)
        if note:
            run.notes.append(note)
        wait_drained(system, workers, 60, cfg.poll_interval)
        warm_counts = _sink_total(sink, warm, 5)
        warmed = sum(int(c["count"]) for c in warm_counts.values())
        memory0 = run.stats.memory()
        workers.signal_tree(signal.SIGSTOP)
        try:
            # not checked against n: a consumer blocked on a pop when it was stopped may
            # hold a job the system does not list yet (the end checks every job ran once)
            system.fill(n)
        finally:
            tree = workers.tree()
            cpu0, _ = tree_usage(tree)
            meter = Meter(run.stats)
            _signal(tree, signal.SIGCONT)
        try:
            _, end, left = _watch_drain(system, workers, cfg, n)
        except ScenarioFailed as exc:
            workers.stop(str(exc))
            raise
        meter.mark()
        cpu1, hwm = tree_usage(workers.tree())
        counts = _sink_total(sink, warmed + n - left, 5)
        try:
            reports = workers.stop()
        except ScenarioFailed as exc:
            if not left:
                raise
            reports = []
            run.notes.append(f"after the bound: {exc}")
    done = n - left
    ran = sum(int(c["count"]) for c in counts.values()) - warmed
    if left == 0 and ran != n:
        raise ScenarioFailed(f"the workers ran {ran} jobs; {n} were enqueued")
    elapsed, sample = meter.sample(max(done, 1), elapsed=end - meter.t0_wall, producer=False)
    run.note_stderr(reports)
    sample[WORKER_CPU.key] = 100 * (cpu1 - cpu0) / elapsed
    sample[PEAK_RSS.key] = hwm / 1024
    if left:
        run.notes.append(f"stopped at the {cfg.drain_bound:.0f} s bound with {done:,} of {n:,} "
                         "jobs done; the rate is over those")  # fmt: skip
    return {
        RATE.key: done / elapsed,
        KEPT.key: (run.stats.memory() - memory0) / max(done, 1),
        "seconds": elapsed,
        "jobs_done": done,
        "bounded": float(left > 0),
        "processes_ran": float(sum(1 for c in counts.values() if int(c["count"]) > 0)),
        "warm_up_jobs": float(warmed),
        **sample,
    }


def _ready(system: System, workers: Workers, cfg: Config) -> None:
    """One no-op job through the workers, so they are connected and idle afterwards."""
    system.fill(1)
    wait_drained(system, workers, 60, cfg.poll_interval)


def latency(system: System, run: Run) -> Sample:
    cfg = run.cfg
    n = round(cfg.latency_rate * cfg.latency_seconds)
    with Workers(system, 1, cfg) as workers:
        _ready(system, workers, cfg)
        time.sleep(cfg.idle_before)  # the worker is idle, blocked waiting for work
        sent = system.produce_stamped(cfg.latency_rate, n)
        _, reports = drained_reports(system, workers, _drain_timeout(n), cfg.poll_interval)
    lat = sorted(reports[0].latencies)
    if len(lat) != n:
        raise ScenarioFailed(f"the worker started {len(lat)} stamped jobs; {n} were sent")
    run.note_stderr(reports)
    return {
        P50.key: 1000 * percentile(lat, 50),
        P99.key: 1000 * percentile(lat, 99),
        MAX.key: 1000 * lat[-1],
        "min": 1000 * lat[0],
        "jobs": n,
        "sent_rate": n / sent if sent else 0.0,
    }


def priority(system: System, run: Run) -> Sample:
    if system.priority is None:
        raise NotSupported("no priorities")
    cfg, n = run.cfg, run.cfg.jobs
    system.fill_low(n)
    _expect_outstanding(system, n)
    timeout = _drain_timeout(n)
    with Workers(system, 1, cfg, priority=True) as workers:
        deadline = time.monotonic() + timeout
        while (left := system.outstanding()) > n - cfg.high_after:
            if time.monotonic() > deadline or not workers.alive():
                workers.stop(f"the worker took {n - left} low jobs in {timeout:.0f} s")
            time.sleep(cfg.poll_interval)
        t0 = system.enqueue_high(cfg.high_jobs)
        done = workers.procs[0].wait_event("high_done", timeout)
        reports = workers.stop()
    starts = reports[0].high_starts
    if done.get("event") != "high_done" or len(starts) < cfg.high_jobs:
        raise ScenarioFailed(
            f"{len(starts)} of {cfg.high_jobs} high jobs started within {timeout:.0f} s "
            f"({done.get('event')})"
        )
    run.note_stderr(reports)
    return {
        HIGH_WAIT.key: 1000 * (max(starts) - t0),
        LOW_MEANWHILE.key: reports[0].low_before_high_done - (n - left),
        "first_high_ms": 1000 * (min(starts) - t0),
        "low_left_at_send": left,
    }


def _wait_marks(
    system: System, workers: Workers, kind: str, n: int, *, timeout: float, poll: float
) -> None:
    """Until ``n`` long jobs pushed a ``kind`` mark (`bench.adapter.Sink.long_start`)."""
    deadline = time.monotonic() + timeout
    with redis.Redis.from_url(system.url) as client:
        while (seen := client.lrange(MARKS_KEY, 0, -1).count(kind.encode())) < n:
            if not workers.alive() or time.monotonic() > deadline:
                workers.stop(f"{seen} of {n} long jobs had {kind}ed after {timeout:.0f} s")
                raise ScenarioFailed(f"{seen} of {n} long jobs {kind}ed")  # stop raised first
            time.sleep(poll)


def urgent_long(system: System, run: Run) -> Sample:
    cfg = run.cfg
    argvs, running = system.urgent_long_workers()
    system.fill_long(cfg.long_jobs, cfg.long_units, cfg.unit_seconds)
    long_s = cfg.long_units * cfg.unit_seconds
    timeout = 60 + 4 * long_s * -(-cfg.long_jobs // running)
    with Workers(system, 0, cfg, argvs=argvs) as workers:
        _wait_marks(system, workers, "start", running, timeout=60, poll=cfg.poll_interval)
        sent = system.produce_urgent(cfg.urgent_rate, cfg.urgent_jobs)
        _wait_marks(system, workers, "end", cfg.long_jobs, timeout=timeout, poll=cfg.poll_interval)
        _, reports = drained_reports(system, workers, 60, cfg.poll_interval)
    lat = sorted(x for r in reports for x in r.latencies)
    if len(lat) != cfg.urgent_jobs:
        raise ScenarioFailed(f"the workers started {len(lat)} urgent jobs; "
                             f"{cfg.urgent_jobs} were sent")  # fmt: skip
    starts = [x for r in reports for x in r.long_starts]
    ends = [x for r in reports for x in r.long_ends]
    if len(starts) != cfg.long_jobs or len(ends) != cfg.long_jobs:
        raise ScenarioFailed(f"{len(starts)} long job starts and {len(ends)} ends recorded; "
                             f"{cfg.long_jobs} jobs were sent, each to run once")  # fmt: skip
    run.note_stderr(reports)
    return {
        P50.key: 1000 * percentile(lat, 50),
        P99.key: 1000 * percentile(lat, 99),
        MAX.key: 1000 * lat[-1],
        LONG_TOTAL.key: max(ends) - min(starts),
        "min": 1000 * lat[0],
        "long_at_once": running,
        "sent_rate": cfg.urgent_jobs / sent if sent else 0.0,
    }


ENQUEUE_EXTRA = (PRODUCER_CPU, REDIS_CPU, REDIS_US, REDIS_COMMANDS)


def scenarios(cfg: Config) -> list[Scenario]:
    n = f"{cfg.jobs:,}"
    found = [
        Scenario("enqueue_one", f"1. Enqueue {n} no-op jobs one by one", enqueue_one_by_one,
                 (RATE, *ENQUEUE_EXTRA), (RATE,),
                 about="One producer, one call (one round trip) per job."),
        Scenario("enqueue_bulk", f"1b. Enqueue {n} no-op jobs in bulk", enqueue_bulk,
                 (RATE, *ENQUEUE_EXTRA), (RATE,),
                 about="The system's bulk API (see the systems table); list building included."),
    ]  # fmt: skip
    for p in cfg.drain_processes:
        found.append(
            Scenario(
                f"drain_{p}",
                f"2. Drain {n} queued no-op jobs, {p} worker process{'es' if p > 1 else ''}",
                drain,
                (RATE, WORKER_CPU, REDIS_CPU, REDIS_US, REDIS_COMMANDS, PEAK_RSS, KEPT),
                (RATE,),
                {"processes": p},
                about=(
                    "From the first job's start (worker startup excluded) until the harness "
                    "sees nothing queued or running (polled every 5 ms). Worker CPU and peak "
                    "RSS are summed over the processes."
                    if p == 1
                    else "The system's own way to run several processes (below). The pool "
                    "starts on an empty queue and runs warm-up jobs until each of its "
                    "processes has run one; then its processes are stopped (SIGSTOP), the "
                    "jobs queued, the processes resumed (SIGCONT): timed from there until the "
                    "harness sees nothing queued or running (polled every 5 ms). Worker CPU "
                    "(from /proc: every process of the pool, its master or supervisor "
                    "included) and peak RSS are summed over the processes."
                ),
            )
        )
    found += [
        Scenario(
            "latency",
            f"3. Enqueue-to-start latency, {cfg.latency_rate:g} jobs/s for "
            f"{cfg.latency_seconds:g} s, 1 idle worker process",
            latency,
            (P50, P99, MAX),
            (P50, P99),
            about="Each job carries its producer's time.time(); the task records its start "
            "time minus that. The worker has run one job and idled 0.5 s first.",
        ),
        Scenario(
            "priority",
            f"4. Priority under load: {n} low jobs queued, then {cfg.high_jobs} high ones",
            priority,
            (HIGH_WAIT, LOW_MEANWHILE),
            (HIGH_WAIT,),
            about=f"One worker process drains the low jobs; once it has taken {cfg.high_after} "
            f"of them, {cfg.high_jobs} high-priority jobs are enqueued one by one. Time from the "
            "first high enqueue until the last high job started (start times recorded by the "
            "worker); low jobs started meanwhile is approximate (from the queue depth when the "
            "high jobs were sent).",
        ),
        Scenario(
            "urgent_long",
            f"7. Urgent behind long jobs: {cfg.long_jobs} slots busy with long jobs of "
            f"{cfg.long_units} x {cfg.unit_seconds * 1000:g} ms, {cfg.urgent_jobs} urgent jobs at "
            f"{cfg.urgent_rate:g}/s",
            urgent_long,
            (P50, P99, MAX, LONG_TOTAL),
            (P99, LONG_TOTAL),
            about=f"{cfg.long_jobs} worker slots in all, each busy with a long low-priority job "
            f"({cfg.long_units} sleeps of {cfg.unit_seconds * 1000:g} ms; drumbeat calls "
            "`checkpoint()` after each); once they run, urgent no-op jobs are enqueued one at a "
            "time, each carrying its producer's time.time(): enqueue-to-start p50/p99/max of the "
            "urgent jobs, and the long jobs' total time (first start to last end). Each system "
            "runs it as its users would (below): its priorities in one worker, or a queue of its "
            "own for the urgent jobs with a slot kept for it (then fewer long jobs run at once).",
        ),
    ]
    if cfg.scenarios:
        found = [s for s in found if s.key in cfg.scenarios]
    return found


# -- one system, one repetition (the child process) ----------------------------------------------


def load_system(name: str, url: str) -> System:
    module, _, cls = SYSTEMS[name].partition(":")
    system: System = getattr(importlib.import_module(module), cls)(url)
    return system


def warm_up(system: System, cfg: Config) -> None:
    """Load the scripts into Redis and the worker's modules into the page cache."""
    system.reset()
    system.enqueue_one_by_one(20)
    if system.bulk is not None:
        system.enqueue_bulk(20)
    with Workers(system, 1, cfg) as workers:
        drained_reports(system, workers, 60, 0.02)


def run_child(name: str, url: str, cfg: Config, out: dict[str, Any]) -> None:
    """All scenarios of one system, once, into ``out``: what `main` collects from ``--child``."""
    stats = RedisStats(url)
    system = load_system(name, url)
    out.update(
        version=system.version(),
        settings=system.settings,
        bulk=system.bulk,
        priority=system.priority,
        urgent_long=getattr(system, "urgent_long", None),
        pool=getattr(system, "pool", None),
        python=f"{platform.python_version()} ({sys.executable})",
        scenarios={},
    )
    try:
        warm_up(system, cfg)
        only = getattr(system, "scenarios", None)
        for scenario in scenarios(cfg):
            system.reset()
            run = Run(cfg, scenario.params, stats)
            try:
                if only is not None and scenario.key not in only:
                    raise NotSupported("a baseline, not a queue")
                entry: dict[str, Any] = {"sample": scenario.run(system, run)}
                shown = ", ".join(
                    f"{m.label} {_fmt(entry['sample'][m.key], m.digits)} {m.unit}"
                    for m in scenario.metrics[:3]
                    if m.key in entry["sample"]
                )
            except NotSupported as exc:
                entry, shown = {"unsupported": str(exc)}, str(exc)
            except ScenarioFailed as exc:
                entry, shown = {"error": str(exc)}, f"FAILED: {exc}"
            entry["notes"] = run.notes
            out["scenarios"][scenario.key] = entry
            _progress(f"{name} {scenario.key}: {shown.splitlines()[0]}")
    finally:
        system.close()
        stats.close()


def child_main(args: argparse.Namespace) -> int:
    cfg = Config(**json.loads(args.config))
    cfg = Config(**{**asdict(cfg), "drain_processes": tuple(cfg.drain_processes),
                    "scenarios": tuple(cfg.scenarios)})  # fmt: skip
    result: dict[str, Any] = {"system": args.child}
    try:
        run_child(args.child, args.url, cfg, result)
    except BaseException as exc:
        result["error"] = "".join(traceback.format_exception(exc))
    Path(args.result).write_text(json.dumps(result))
    return 0


def run_system(name: str, python: str, url: str, cfg: Config) -> dict[str, Any]:
    """One repetition of one system, in a child process of ``python``."""
    with tempfile.TemporaryDirectory(prefix="drumbeat-bench-") as tmp:
        result = Path(tmp) / "result.json"
        argv = [python, "-m", "bench.core", "--child", name, "--url", url,
                "--config", json.dumps(asdict(cfg)), "--result", str(result)]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        timeout = 600 + 10 * cfg.jobs / 200
        # Its own process group, with its workers: whatever happens, none outlives the run.
        proc = subprocess.Popen(argv, cwd=REPO, env=env, start_new_session=True)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return {"system": name, "error": f"the run did not finish within {timeout:.0f} s"}
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if not result.exists():
            return {"system": name, "error": f"the child exited with {proc.returncode}"}
        data: dict[str, Any] = json.loads(result.read_text())
        return data


# -- what Redis itself allows ----------------------------------------------------------------------

SCRIPT = (
    "redis.call('HSET', KEYS[1] .. ARGV[1], 'spec', ARGV[1]) "
    "redis.call('ZADD', KEYS[2], ARGV[1], ARGV[1]) return 1"
)
"""The small script of the EVALSHA line: an HSET and a ZADD, about what an enqueue does."""
CLIENT_SETTINGS = (("-c 1", ["-c", "1"]), ("-c 50", ["-c", "50"]),
                   ("-c 50 -P 16", ["-c", "50", "-P", "16"]))  # fmt: skip


def ceiling_commands(sha: str) -> list[tuple[str, list[str]]]:
    """(label, command) of each `redis-benchmark` line; random members and keys from 10^9."""
    return [
        ("EVALSHA (HSET+ZADD script)", ["EVALSHA", sha, "2", "ceil:h:", "ceil:s", "__rand_int__"]),
        ("ZADD", ["ZADD", "ceil:z", "__rand_int__", "__rand_int__"]),
        ("ZPOPMIN", ["ZPOPMIN", "ceil:z"]),
        ("BZPOPMIN", ["BZPOPMIN", "ceil:z", "1"]),
        ("HSET", ["HSET", "ceil:h:__rand_int__", "f", "v"]),
        ("HGET", ["HGET", "ceil:h:__rand_int__", "f"]),
    ]


def _top_up(client: redis.Redis, key: str, n: int) -> None:
    """At least ``n`` members in the sorted set the pops take from (untimed), so BZPOPMIN never
    blocks."""
    missing = n - int(client.zcard(key))
    base = 2_000_000_000  # apart from redis-benchmark's random members
    for start in range(0, max(0, missing), 10_000):
        stop = min(missing, start + 10_000)
        client.zadd(key, {f"m{base + i}": base + i for i in range(start, stop)})


def redis_ceiling(server: RedisServer, cfg: Config) -> dict[str, Any]:
    """One repetition of `redis-benchmark` on the same server: ops/s per command and setting."""
    binary = shutil.which("redis-benchmark") or str(
        Path(server.binary).with_name("redis-benchmark")
    )
    if not Path(binary).exists():
        return {"error": "redis-benchmark not found (Debian: apt-get install redis-tools)"}
    requests = cfg.ceiling_requests
    results: dict[str, float] = {}
    with server.client() as client:
        client.flushdb()
        sha = str(client.script_load(SCRIPT))
        for label, command in ceiling_commands(sha):
            for setting, flags in CLIENT_SETTINGS:
                if "POP" in label:
                    _top_up(client, "ceil:z", requests + 1000)
                argv = [binary, "-h", "127.0.0.1", "-p", str(server.port), "-n", str(requests),
                        "-r", "1000000000", "--csv", *flags, *command]  # fmt: skip
                try:
                    out = subprocess.run(
                        argv, capture_output=True, text=True, timeout=120, check=False
                    )
                except subprocess.TimeoutExpired:
                    return {"error": f"{shlex.join(argv)} did not finish within 120 s"}
                rows = [line.split('","') for line in out.stdout.splitlines()[1:] if line.strip()]
                if out.returncode != 0 or not rows:
                    return {"error": f"{shlex.join(argv)}: {out.stderr.strip() or out.stdout}"}
                results[f"{label} | {setting}"] = float(rows[0][1].strip('"'))
        client.flushdb()
    return {"ops": results, "binary": binary}


# -- reporting -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Report:
    markdown: str
    results: dict[str, Any]
    failed: bool


def _stats(values: Sequence[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": list(values)}  # fmt: skip


def _cell(stat: Mapping[str, Any] | None, digits: int) -> str:
    if not stat:
        return ""
    median, low, high = (_fmt(stat[k], digits) for k in ("median", "min", "max"))
    return median if len(stat["values"]) == 1 else f"{median} ({low}-{high})"


def _ratio_digits(stat: Mapping[str, Any]) -> int:
    return 2 if stat["median"] >= 0.1 else 3


NOT_RUN = "the system failed before this scenario (see Problems)"


def aggregate(data: Mapping[str, Any], found: Sequence[Scenario]) -> dict[str, Any]:
    """Per scenario and system: metric stats over the repetitions, drumbeat/peer ratios taken
    repetition by repetition, and the errors, notes and unsupported features seen."""
    results: dict[str, Any] = {}
    runs: Mapping[str, list[dict[str, Any]]] = data["runs"]
    for sc in found:
        per: dict[str, Any] = {}
        for name, reps in runs.items():
            samples, errors, notes, unsupported = [], [], [], ""
            for i, rep in enumerate(reps, 1):
                entry = rep.get("scenarios", {}).get(sc.key)
                if entry is None:
                    errors.append(f"repetition {i}: {NOT_RUN}")
                    continue
                notes += [f"repetition {i}: {x}" for x in entry.get("notes", [])]
                if "unsupported" in entry:
                    unsupported = entry["unsupported"]
                elif "error" in entry:
                    errors.append(f"repetition {i}: {entry['error']}")
                samples.append(entry.get("sample"))
            good = [s for s in samples if s]
            per[name] = {
                "metrics": {
                    m.key: _stats([s[m.key] for s in good if m.key in s])
                    for m in sc.metrics
                    if any(m.key in s for s in good)
                },
                "samples": samples,
                "errors": errors,
                "notes": notes,
                "unsupported": unsupported,
                "runs": len(good),
            }
        base = per.get("drumbeat", {}).get("samples", [])
        for name, entry in per.items():
            entry["ratios"] = {}
            if name == "drumbeat":
                continue
            for m in sc.ratios:
                pairs = [d[m.key] / p[m.key] for d, p in zip(base, entry["samples"], strict=False)
                         if d and p and p[m.key]]  # fmt: skip
                if pairs:
                    entry["ratios"][m.key] = _stats(pairs)
        results[sc.key] = {"title": sc.title, "about": sc.about, "systems": per,
                           "metrics": [asdict(m) for m in sc.metrics],
                           "ratio_metrics": [m.key for m in sc.ratios]}  # fmt: skip
    return results


def header_lines(data: Mapping[str, Any]) -> list[str]:
    info, cfg = data["info"], data["config"]
    load = " ".join(f"{x:.2f}" for x in info["load_start"])
    end = " ".join(f"{x:.2f}" for x in info.get("load_end", []))
    lines = [
        f"- command: `{data['command']}`",
        f"- machine: {info['cores']} cores (os.cpu_count), {info['memory_gib']} GiB memory "
        f"(MemTotal), {info['cpu']}, {info['platform']}",
        f"- Redis {info['redis']} ({info['redis_binary']}), private, on a free port, no "
        f"persistence; Python {info['python']} (harness); drumbeat git {info['git']}",
        f"- load average (1/5/15 min): {load} at start, {end} at end; the worker, Redis and the "
        "harness share these cores, and other work on the machine shows up as spread",
        f"- {cfg['jobs']:,} jobs per scenario, {cfg['repeat']} repetition(s); each cell is the "
        "median (min-max) over the repetitions; in each repetition every system runs all its "
        "scenarios in a fresh process, systems back to back (the order rotates), so each "
        "drumbeat/peer ratio is the median of the ratios of the same repetition"
        + (", --quick" if cfg["quick"] else ""),
    ]
    if data.get("note"):
        lines.append(f"- note: {data['note']}")
    return lines


def systems_lines(data: Mapping[str, Any]) -> list[str]:
    lines = ["| system | version | one worker process (its settings) | bulk enqueue | priorities |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, reps in data["runs"].items():
        ok = [r for r in reps if "version" in r]
        if not ok:
            why = (reps[0].get("error", "did not run") if reps else "did not run").splitlines()
            lines.append(f"| {name} | **{_oneline(why[-1] if why else '')}** | | | |")
            continue
        r = ok[0]
        lines.append(f"| {name} | {r['version']} | {r['settings']} | {r['bulk'] or 'none'} | "
                     f"{r['priority'] or 'none'} |")  # fmt: skip
    return lines


def _oneline(text: str, width: int = 160) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= width else text[: width - 1] + "…"


def scenario_lines(key: str, res: Mapping[str, Any], found: Sequence[Scenario]) -> list[str]:
    sc = next(s for s in found if s.key == key)
    head = ["system", *(f"{m.label} ({m.unit})" for m in sc.metrics)]
    head += [f"drumbeat/peer {m.label} ({'>' if m.higher_better else '<'}1: drumbeat better)"
             for m in sc.ratios]  # fmt: skip
    lines = [f"## {sc.title}", "", sc.about, "", "| " + " | ".join(head) + " |",
             "|---|" + "---:|" * (len(head) - 1)]  # fmt: skip
    for name, entry in res["systems"].items():
        if entry["unsupported"]:
            row = [name, f"— ({entry['unsupported']})", *[""] * (len(head) - 2)]
        elif not entry["runs"]:
            why = entry["errors"][0].splitlines()[0] if entry["errors"] else "did not run"
            row = [name, f"**FAILED**: {_oneline(why, 120)}", *[""] * (len(head) - 2)]
        else:
            bounded = sum(1 for x in entry["samples"] if x and x.get("bounded"))
            row = [name + (f" (**{len(entry['errors'])} failed**)" if entry["errors"] else "")
                   + (f" † ({bounded} of {entry['runs']})" if bounded else "")]  # fmt: skip
            row += [_cell(entry["metrics"].get(m.key), m.digits) for m in sc.metrics]
            for m in sc.ratios:
                stat = entry["ratios"].get(m.key)
                row.append(_cell(stat, _ratio_digits(stat)) if stat else "")
        lines.append("| " + " | ".join(row) + " |")
    if any(x and x.get("bounded") for e in res["systems"].values() for x in e["samples"]):
        lines += ["", "† stopped at the time bound in that many repetitions; the rate is taken "
                  "over the jobs finished by then."]  # fmt: skip
    return lines


def pool_lines(data: Mapping[str, Any]) -> list[str]:
    """How each system ran the drains with several processes (`drain_pool`)."""
    lines = ["How each system runs several processes (`drain_2`, `drain_4`; `drain_1` is its one "
             "worker process, as in the systems table):", ""]  # fmt: skip
    for name, reps in data["runs"].items():
        how = next((r["pool"] for r in reps if r.get("pool")), None)
        lines.append(f"- {name}: {how or 'N copies of its one-process worker'}")
    return lines


def urgent_long_lines(data: Mapping[str, Any]) -> list[str]:
    """How each system ran the urgent-behind-long scenario (`System.urgent_long`)."""
    lines = ["How each system runs it:", ""]
    for name, reps in data["runs"].items():
        how = next((r["urgent_long"] for r in reps if r.get("urgent_long")), None)
        lines.append(f"- {name}: {how or 'not supported'}")
    return lines


def ceiling_lines(data: Mapping[str, Any], results: Mapping[str, Any]) -> list[str]:
    reps = [c for c in data["ceiling"] if "ops" in c]
    errors = [c["error"] for c in data["ceiling"] if "error" in c]
    lines = ["## 6. What Redis itself allows: redis-benchmark on the same server", ""]
    if not reps:
        return [*lines, f"Not measured: {errors[0] if errors else 'skipped'}."]
    lines += [
        f"`{reps[0]['binary']}` against the same redis-server, "
        f"{data['config']['ceiling_requests']:,} requests per line (the sorted set is topped up "
        "before each pop line, so BZPOPMIN never blocks), random members/keys from 10^9; ops/s, "
        "median (min-max) "
        f"over {len(reps)} repetition(s). The EVALSHA script is `{SCRIPT}`. `-c 1` is one "
        "connection waiting for each reply, like one producer enqueueing one by one; `-P 16` "
        "pipelines 16 commands per connection.",
        "",
        "| command | " + " | ".join(s for s, _ in CLIENT_SETTINGS) + " |",
        "|---|" + "---:|" * len(CLIENT_SETTINGS),
    ]
    ops = {k: _stats([r["ops"][k] for r in reps]) for k in reps[0]["ops"]}
    for label, _ in ceiling_commands(""):
        cells = [_cell(ops.get(f"{label} | {s}"), 0) for s, _ in CLIENT_SETTINGS]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", *versus_ceiling_lines(ops, results)]
    return lines


def versus_ceiling_lines(ops: Mapping[str, Any], results: Mapping[str, Any]) -> list[str]:
    """Where drumbeat stands against those numbers."""

    def drumbeat(key: str, metric: str) -> float | None:
        stat = results.get(key, {}).get("systems", {}).get("drumbeat", {}).get("metrics", {})
        return stat[metric]["median"] if metric in stat else None

    lines = ["How far drumbeat is from that (medians of this run):", ""]
    one = drumbeat("enqueue_one", RATE.key)
    eval1 = ops.get("EVALSHA (HSET+ZADD script) | -c 1")
    if one and eval1:
        share = 100 * one / eval1["median"]
        lines.append(f"- enqueue one by one: {one:,.0f} jobs/s = {share:.0f}% of one connection's "
                     f"EVALSHA round trips ({eval1['median']:,.0f}/s).")  # fmt: skip
    best = max((v["median"] for k, v in ops.items() if k.startswith("ZADD")), default=0.0)
    for key in ("enqueue_bulk", "drain_1", "drain_2", "drain_4"):
        rate, cmds, cpu = (drumbeat(key, m.key) for m in (RATE, REDIS_COMMANDS, REDIS_CPU))
        us = drumbeat(key, REDIS_US.key)
        if rate and cmds and best:
            per_job = f", {us:.1f} µs of Redis CPU per job" if us else ""
            lines.append(
                f"- {results[key]['title'].split(' ', 1)[1]}: {rate:,.0f} jobs/s x {cmds:.1f} "
                f"Redis commands/job = {rate * cmds:,.0f} commands/s, with Redis at "
                f"{cpu or 0:.0f}% of a core{per_job} (Redis runs commands on one core); "
                f"pipelined ZADD peaks at {best:,.0f}/s."
            )
    return lines if len(lines) > 2 else []


def problem_lines(results: Mapping[str, Any], data: Mapping[str, Any]) -> list[str]:
    """Failures and worker warnings; a warning repeated in later repetitions is shown once."""
    lines: list[str] = []
    seen: set[tuple[str, str]] = set()

    def add(head: str, text: str) -> None:
        first, *rest = text.splitlines() or [""]
        if first.startswith("Traceback") and rest:
            first = rest[-1]  # the exception itself
        lines.append(f"- {head}{first}")
        if rest:
            lines.extend(["", "  ```", *(f"  {x}" for x in rest[-25:]), "  ```", ""])

    for name, reps in data["runs"].items():
        for i, rep in enumerate(reps, 1):
            if "error" in rep:
                add(f"{name}, repetition {i}: ", rep["error"])
    for res in results.values():
        for name, entry in res["systems"].items():
            for text in entry["errors"] + entry["notes"]:
                if NOT_RUN in text:
                    continue
                key = (name, text.split(": ", 1)[-1])
                if key not in seen:
                    seen.add(key)
                    add(f"{name}, {res['title']}, ", text)
    lines += [f"- redis-benchmark: {c['error']}" for c in data["ceiling"] if "error" in c]
    return lines


def build_report(data: Mapping[str, Any], found: Sequence[Scenario]) -> Report:
    results = aggregate(data, found)
    names = list(data["runs"])
    title = "drumbeat" + (" vs " + ", ".join(names[1:]) if len(names) > 1 else "")
    body = [f"# Job-queue benchmark: {title}", "", *header_lines(data), "",
            "## Systems", "", *systems_lines(data)]  # fmt: skip
    for key, res in results.items():
        body += ["", *scenario_lines(key, res, found)]
        if key == "urgent_long":
            body += ["", *urgent_long_lines(data)]
        drains = [k for k in results if k.startswith("drain_") and k != "drain_1"]
        if drains and key == drains[-1]:
            body += ["", *pool_lines(data)]
    if not data["config"]["scenarios"] or "ceiling" in data["config"]["scenarios"]:
        body += ["", *ceiling_lines(data, results)]
    problems = problem_lines(results, data)
    if problems:
        body += ["", "## Problems and worker warnings", "", *problems]
    failed = any(
        res["systems"].get("drumbeat", {}).get("errors") for res in results.values()
    ) or any("error" in r for r in data["runs"].get("drumbeat", []))
    return Report("\n".join(body) + "\n", results, failed)


def write_outputs(out: Path, data: Mapping[str, Any], report: Report, charts: bool) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    base = out / f"core-{'quick-' if data['config']['quick'] else ''}{stamp}"
    json_path, md_path = base.with_suffix(".json"), base.with_suffix(".md")
    json_path.write_text(json.dumps({**data, "results": report.results}, indent=1) + "\n")
    md_path.write_text(report.markdown)
    paths = [md_path, json_path]
    if charts:
        paths += draw_charts(json_path)
    return paths


def draw_charts(json_path: Path) -> list[Path]:
    """PNG charts by `bench.charts`, with matplotlib from here or from the peers venv."""
    from . import peers_env

    python = sys.executable
    if importlib.util.find_spec("matplotlib") is None:
        existing = peers_env.existing_python()
        if existing is None:
            _progress("charts skipped: matplotlib is not installed here; "
                      "`python -m bench.peers_env` makes the venv that has it")  # fmt: skip
            return []
        python = str(existing)
    out = subprocess.run([python, "-m", "bench.charts", str(json_path)], cwd=REPO,
                         capture_output=True, text=True, check=False)  # fmt: skip
    if out.returncode != 0:
        _progress(f"charts failed:\n{_tail(out.stderr)}")
        return []
    return [Path(line) for line in out.stdout.split()]


# -- the session (the parent process) -------------------------------------------------------------


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def _fmt(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


@contextlib.contextmanager
def bench_lock(enabled: bool) -> Iterator[None]:
    """``flock /tmp/drumbeat-bench.lock``: one full benchmark at a time on this machine. A lock
    already held through an inherited descriptor (``flock FILE python -m bench.core``) counts."""
    if not enabled or _lock_inherited():
        yield
        return
    with open(LOCK_PATH, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _progress(f"waiting for {LOCK_PATH} (another benchmark is running)")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _lock_inherited() -> bool:
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{fd}") == LOCK_PATH:
                    return True
    return False


def machine_info(server: RedisServer) -> dict[str, Any]:
    mem_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    redis_info = server.info()
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "redis": redis_info["version"],
        "redis_binary": redis_info["binary"],
        "git": _git_revision(),
        "load_start": list(os.getloadavg()),
    }


def _git_revision() -> str:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    return rev + (" + uncommitted changes" if git("status", "--porcelain") else "")


def command_line() -> str:
    return f"cd {shlex.quote(os.getcwd())} && " + shlex.join(
        [sys.executable, "-m", "bench.core", *sys.argv[1:]]
    )


def pythons(names: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The interpreter for each system (drumbeat: this one; peers: the peers venv's, made or
    updated first), and the systems that cannot run, with why."""
    found = {name: sys.executable for name in names if name == "drumbeat"}
    broken: dict[str, str] = {}
    peers = [name for name in names if name != "drumbeat"]
    if peers:
        from . import peers_env

        try:
            python = str(peers_env.peers_python())
        except peers_env.PeersEnvError as exc:
            broken = {name: f"not installed: {exc}" for name in peers}
        else:
            found.update((name, python) for name in peers)
    return found, broken


def run_session(
    names: Sequence[str], cfg: Config, server: RedisServer
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Every repetition: `redis-benchmark`, then each system in turn (the order rotates)."""
    found, broken = pythons(names)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    ceilings: list[dict[str, Any]] = []
    for rep in range(cfg.repeat):
        if not cfg.scenarios or "ceiling" in cfg.scenarios:
            _progress(f"repetition {rep + 1}/{cfg.repeat}: redis-benchmark")
            ceilings.append(redis_ceiling(server, cfg))
        order = [n for n in names if n in found]
        order = order[rep % len(order) :] + order[: rep % len(order)] if order else []
        for name in order:
            _progress(f"repetition {rep + 1}/{cfg.repeat}: {name}")
            runs[name].append(run_system(name, found[name], server.url, cfg))
        for name, why in broken.items():
            runs[name].append({"system": name, "error": why})
    return runs, ceilings


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.core", description=__doc__.split("\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="5,000 jobs, 1 repetition, 3 s latency, drumbeat only unless --systems",
    )
    p.add_argument(
        "--systems",
        help=f"comma-separated, from: {', '.join(SYSTEMS)}; or 'all' "
        "(default: all; with --quick: drumbeat)",
    )
    p.add_argument("--repeat", type=int, help="repetitions (default 3; quick 1)")
    p.add_argument("--jobs", type=int, help="jobs per scenario (default 20,000; quick 5,000)")
    p.add_argument(
        "--scenarios",
        help="comma-separated subset of: enqueue_one, enqueue_bulk, "
        "drain_1, drain_2, drain_4, latency, priority, urgent_long, ceiling",
    )
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results", help="results directory")
    p.add_argument("--note", default="", help="free text recorded with the results")
    p.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)  # fmt: skip
    for name in ("repeat", "jobs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name} must be >= 1")
    if args.child:
        return args
    spec = args.systems or ("drumbeat" if args.quick else "all")
    everything = [name for name in SYSTEMS if name not in BASELINES]
    args.names = everything if spec == "all" else [s.strip() for s in spec.split(",")]
    unknown = [s for s in args.names if s not in SYSTEMS]
    if unknown or not args.names:
        p.error(f"unknown system(s) {unknown}; known: {', '.join(SYSTEMS)}")
    return args


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # so the private redis-server and the children are stopped


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.child:
        return child_main(args)
    cfg = Config(
        jobs=args.jobs or (5_000 if args.quick else 20_000),
        repeat=args.repeat or (1 if args.quick else 3),
        quick=args.quick,
        latency_seconds=3.0 if args.quick else 10.0,
        ceiling_requests=10_000 if args.quick else 50_000,
        drain_bound=15.0 if args.quick else 30.0,
        scenarios=tuple(s.strip() for s in args.scenarios.split(",")) if args.scenarios else (),
    )
    command = command_line()
    print(f"$ {command}", file=sys.stderr, flush=True)
    with bench_lock(not args.quick or args.names != ["drumbeat"]), RedisServer() as server:
        info = machine_info(server)
        runs, ceilings = run_session(args.names, cfg, server)
    info["load_end"] = list(os.getloadavg())
    data = {"command": command, "note": args.note, "info": info, "config": asdict(cfg),
            "systems": args.names, "runs": runs, "ceiling": ceilings}  # fmt: skip
    report = build_report(data, scenarios(cfg))
    print(report.markdown)
    paths = write_outputs(args.out, data, report, charts=not args.no_charts)
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
