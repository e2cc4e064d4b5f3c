"""A quick benchmark of drumbeat's core queue: enqueue rate, drain throughput, enqueue-to-start
latency, on a private redis-server started for the run.

    python -m bench.core [--quick] [--repeat N] [--jobs N] [--out bench/results]

Each scenario is a function of a `System` adapter (`bench.adapter`); drumbeat's is in
`bench.drumbeat_system`. A peer system is one more module with an adapter and its worker, and
an entry in `SYSTEMS`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from ._redis import RedisServer
from .adapter import ScenarioFailed, System, WorkerProcess, WorkerReport
from .drumbeat_system import DrumbeatSystem

SYSTEMS: dict[str, Callable[[str], System]] = {"drumbeat": DrumbeatSystem}

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent

Sample = dict[str, float]
"""One repetition of a scenario: metric key -> value (extra keys are kept in the JSON only)."""


@dataclass(frozen=True, slots=True)
class Config:
    jobs: int = 20_000
    repeat: int = 3
    quick: bool = False
    drain_concurrency: tuple[int, ...] = (10, 100)
    latency_rate: float = 50.0
    """Jobs per second the latency producer sends."""
    latency_seconds: float = 10.0
    latency_concurrency: int = 10
    idle_before: float = 0.5
    """Seconds an idle worker is left alone before the latency producer starts."""
    poll_interval: float = 0.005
    """How often the harness looks at the queue depth while a worker drains it: the resolution
    of the drain time (a drain of 20,000 no-op jobs can take under a second)."""


@dataclass(frozen=True, slots=True)
class Metric:
    key: str
    label: str
    unit: str
    digits: int = 0


RATE = Metric("rate", "throughput", "jobs/s")
PRODUCER_CPU = Metric("producer_cpu", "producer CPU", "% of a core")
WORKER_CPU = Metric("worker_cpu", "worker CPU", "% of a core")
REDIS_CPU = Metric("redis_cpu", "Redis CPU", "% of a core")
REDIS_COMMANDS = Metric("redis_commands", "Redis commands per job", "commands", 1)
PEAK_RSS = Metric("peak_rss", "worker peak RSS", "MiB", 1)
KEPT = Metric("kept_bytes", "Redis memory kept per finished job", "bytes")
P50 = Metric("p50", "p50", "ms", 2)
P99 = Metric("p99", "p99", "ms", 2)
MAX = Metric("max", "max", "ms", 2)


@dataclass(slots=True)
class Run:
    """What one repetition of a scenario gets besides the system: settings, its parameters, and
    a place for notes (worker warnings) that go into the report."""

    cfg: Config
    params: Mapping[str, Any]
    notes: list[str] = field(default_factory=list)

    def note_stderr(self, report: WorkerReport) -> None:
        if report.stderr.strip():
            self.notes.append("the worker wrote to stderr:\n" + _tail(report.stderr))


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    run: Callable[[System, Run], Sample]
    metrics: tuple[Metric, ...]
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Result:
    """One metric of one scenario over all its repetitions."""

    system: str
    scenario: str
    metric: Metric
    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)


@dataclass(slots=True)
class ScenarioRun:
    scenario: Scenario
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def results(self, system: str) -> list[Result]:
        return [
            Result(system, self.scenario.name, m, [s[m.key] for s in self.samples])
            for m in self.scenario.metrics
            if self.samples
        ]


# -- measuring helpers ---------------------------------------------------------------------------


class Meter:
    """Wall time, this process's CPU time, and the broker's CPU time and command count over one
    measured span (started on construction)."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.server_cpu0 = system.server_cpu_seconds()
        self.commands0 = system.server_commands()
        self.cpu0 = time.process_time()
        self.t0 = time.perf_counter()
        self._end: tuple[float, float, float | None, int | None] | None = None

    def mark(self) -> None:
        """Ends the span (else `sample` does)."""
        t1, cpu1 = time.perf_counter(), time.process_time()
        self._end = (t1, cpu1, self.system.server_cpu_seconds(), self.system.server_commands())

    def sample(
        self, jobs: int, elapsed: float | None = None, producer: bool = True
    ) -> tuple[float, Sample]:
        """The span's length (``elapsed`` if given, e.g. timed by a worker) and its metrics."""
        if self._end is None:
            self.mark()
        assert self._end is not None
        t1, cpu1, server_cpu1, commands1 = self._end
        elapsed = t1 - self.t0 if elapsed is None else elapsed
        sample: Sample = {}
        if producer:
            sample[PRODUCER_CPU.key] = 100 * (cpu1 - self.cpu0) / elapsed
        if self.server_cpu0 is not None and server_cpu1 is not None:
            sample[REDIS_CPU.key] = 100 * (server_cpu1 - self.server_cpu0) / elapsed
        if self.commands0 is not None and commands1 is not None:
            sample[REDIS_COMMANDS.key] = (commands1 - self.commands0) / jobs
        return elapsed, sample


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def wait_drained(system: System, worker: WorkerProcess, timeout: float, poll: float) -> float:
    """Poll until nothing is queued or running; returns the wall-clock time it was seen empty."""
    deadline = time.monotonic() + timeout
    while True:
        left = system.outstanding()
        if left == 0:
            return time.time()
        if not worker.alive():
            raise ScenarioFailed(f"worker exited with {left} jobs still outstanding")
        if time.monotonic() > deadline:
            raise ScenarioFailed(f"{left} jobs still outstanding after {timeout:.0f} s")
        time.sleep(poll)


def run_worker_until_drained(
    system: System,
    concurrency: int,
    timeout: float,
    poll: float,
    *,
    before: Callable[[], None] = lambda: None,
    meter: Meter | None = None,
) -> tuple[WorkerProcess, float, WorkerReport]:
    """Start a worker, call ``before`` (the producer, if any), wait for an empty queue (and end
    the ``meter``'s span), stop the worker."""
    worker = system.start_worker(concurrency)
    try:
        before()
        end = wait_drained(system, worker, timeout, poll)
        if meter is not None:
            meter.mark()
    except ScenarioFailed as exc:
        try:
            report = worker.stop()
        except ScenarioFailed as stop_exc:
            raise ScenarioFailed(f"{exc}; then {stop_exc}") from None
        raise ScenarioFailed(
            f"{exc}; the worker had run {report.count} jobs\n{_tail(report.stderr)}"
        ) from None
    except BaseException:
        worker.kill()
        raise
    return worker, end, worker.stop()


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _drain_timeout(jobs: int) -> float:
    return 30 + jobs / 250  # far slower than this is a failure, not a number


# -- scenarios -----------------------------------------------------------------------------------


def enqueue_one_by_one(system: System, run: Run) -> Sample:
    n = run.cfg.jobs
    meter = Meter(system)
    for i in range(n):
        system.enqueue_one(i)
    elapsed, sample = meter.sample(n)
    _expect_outstanding(system, n)
    return {RATE.key: n / elapsed, **sample}


def enqueue_bulk(system: System, run: Run) -> Sample:
    n = run.cfg.jobs
    meter = Meter(system)
    system.enqueue_bulk(n)
    elapsed, sample = meter.sample(n)
    _expect_outstanding(system, n)
    return {RATE.key: n / elapsed, **sample}


def drain(system: System, run: Run) -> Sample:
    n, concurrency = run.cfg.jobs, int(run.params["concurrency"])
    memory0 = system.server_memory()
    system.enqueue_bulk(n)
    _expect_outstanding(system, n)
    meter = Meter(system)
    worker, end, report = run_worker_until_drained(
        system, concurrency, _drain_timeout(n), run.cfg.poll_interval, meter=meter
    )
    if report.count != n:
        raise ScenarioFailed(f"the worker ran {report.count} jobs; {n} were enqueued")
    elapsed, sample = meter.sample(n, elapsed=end - worker.started_at, producer=False)
    memory1 = system.server_memory()
    if memory0 is not None and memory1 is not None:
        sample[KEPT.key] = (memory1 - memory0) / n  # outcomes kept for `result_ttl`
    run.note_stderr(report)
    return {
        RATE.key: n / elapsed,
        WORKER_CPU.key: 100 * report.cpu_s / elapsed,
        PEAK_RSS.key: report.peak_rss_kb / 1024,
        "seconds": elapsed,
        **sample,
    }


def latency(system: System, run: Run) -> Sample:
    cfg = run.cfg
    rate, seconds = cfg.latency_rate, cfg.latency_seconds
    n = round(rate * seconds)
    sent: dict[str, float] = {}

    def produce() -> None:
        time.sleep(cfg.idle_before)  # the worker is idle, blocked waiting for work
        t0 = time.perf_counter()
        for i in range(n):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            system.enqueue_stamped(time.time())
        sent["seconds"] = time.perf_counter() - t0

    _, _, report = run_worker_until_drained(
        system,
        cfg.latency_concurrency,
        _drain_timeout(n) + seconds,
        cfg.poll_interval,
        before=produce,
    )
    if len(report.latencies) != n:
        raise ScenarioFailed(f"the worker started {len(report.latencies)} jobs; {n} were sent")
    lat = sorted(report.latencies)
    run.note_stderr(report)
    return {
        P50.key: 1000 * percentile(lat, 50),
        P99.key: 1000 * percentile(lat, 99),
        MAX.key: 1000 * lat[-1],
        "min": 1000 * lat[0],
        "jobs": n,
        "sent_rate": n / sent["seconds"] if sent["seconds"] else 0.0,
        PEAK_RSS.key: report.peak_rss_kb / 1024,
    }


def _expect_outstanding(system: System, n: int) -> None:
    found = system.outstanding()
    if found != n:
        raise ScenarioFailed(f"{found} jobs outstanding after enqueueing {n}")


ENQUEUE_EXTRA = (PRODUCER_CPU, REDIS_CPU, REDIS_COMMANDS)


def scenarios(cfg: Config) -> list[Scenario]:
    n = f"{cfg.jobs:,} jobs"
    found = [
        Scenario(f"enqueue one by one ({n})", enqueue_one_by_one, (RATE, *ENQUEUE_EXTRA)),
        Scenario(f"enqueue bulk ({n})", enqueue_bulk, (RATE, *ENQUEUE_EXTRA)),
    ]
    for c in cfg.drain_concurrency:
        found.append(
            Scenario(
                f"drain, 1 worker, concurrency {c} ({n})",
                drain,
                (RATE, WORKER_CPU, REDIS_CPU, REDIS_COMMANDS, PEAK_RSS, KEPT),
                {"concurrency": c},
            )
        )
    found.append(
        Scenario(
            f"latency enqueue-to-start, {cfg.latency_rate:g} jobs/s for {cfg.latency_seconds:g} s, "
            f"idle worker, concurrency {cfg.latency_concurrency}",
            latency,
            (P50, P99, MAX),
        )
    )
    return found


# -- running -------------------------------------------------------------------------------------


def run_scenario(system: System, scenario: Scenario, cfg: Config) -> ScenarioRun:
    run = ScenarioRun(scenario)
    for rep in range(1, cfg.repeat + 1):
        system.reset()
        one = Run(cfg, scenario.params)
        try:
            sample = scenario.run(system, one)
        except ScenarioFailed as exc:
            run.errors.append(f"repetition {rep}: {exc}")
            _progress(f"{scenario.name} #{rep}: FAILED: {exc}")
            continue
        finally:
            run.notes += [f"repetition {rep}: {note}" for note in one.notes]
        run.samples.append(sample)
        shown = ", ".join(
            f"{m.label} {_fmt(sample[m.key], m.digits)} {m.unit}"
            for m in scenario.metrics
            if m.key in sample
        )
        _progress(f"{scenario.name} #{rep}: {shown}")
    return run


def warm_up(system: System) -> None:
    """Load the scripts into Redis and the worker's modules into the page cache."""
    system.reset()
    for i in range(50):
        system.enqueue_one(i)
    system.enqueue_bulk(50)
    system.enqueue_stamped(time.time())
    run_worker_until_drained(system, 10, 60, 0.02)


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def _fmt(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


# -- reporting -----------------------------------------------------------------------------------


def machine_info(server: RedisServer, system: System) -> dict[str, Any]:
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
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "redis": redis_info["version"],
        "redis_binary": redis_info["binary"],
        "system": system.name,
        "system_version": system.version(),
        "git": _git_revision(),
        "redis_py": _dist_version("redis"),
        "hiredis": _dist_version("hiredis"),
        "load_start": list(os.getloadavg()),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


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


def header_lines(command: str, info: Mapping[str, Any], cfg: Config, note: str) -> list[str]:
    load = " ".join(f"{x:.2f}" for x in info["load_start"])
    end = info.get("load_end")
    lines = [
        f"- command: `{command}`",
        f"- machine: {info['cores']} cores (os.cpu_count), {info['memory_gib']} GiB memory "
        f"(MemTotal), {info['cpu']}, {info['platform']}",
        f"- software: Python {info['python']}, Redis {info['redis']} ({info['redis_binary']}), "
        f"{info['system']} {info['system_version']} (git {info['git']}), "
        f"redis-py {info['redis_py']}, hiredis {info['hiredis']}",
        f"- load average (1/5/15 min): {load} at start"
        + (f", {' '.join(f'{x:.2f}' for x in end)} at end" if end else ""),
        f"- settings: {cfg.jobs:,} jobs per scenario, {cfg.repeat} repetition(s) "
        f"(median, spread min-max), latency {cfg.latency_rate:g} jobs/s for "
        f"{cfg.latency_seconds:g} s{', --quick' if cfg.quick else ''}",
    ]
    if note:
        lines.append(f"- note: {note}")
    return lines


def table_lines(runs: Sequence[ScenarioRun], system: str) -> list[str]:
    lines = [
        "| scenario | metric | median | spread (min-max) | unit | runs |",
        "|---|---|---:|---:|---|---:|",
    ]
    for run in runs:
        for r in run.results(system):
            d = r.metric.digits
            lines.append(
                f"| {run.scenario.name} | {r.metric.label} | {_fmt(r.median, d)} | "
                f"{_fmt(r.low, d)}-{_fmt(r.high, d)} | {r.metric.unit} | {len(r.values)} |"
            )
        if run.errors:
            lines.append(
                f"| {run.scenario.name} | **FAILED** {len(run.errors)} of "
                f"{len(run.errors) + len(run.samples)} | | | | |"
            )
    return lines


def problem_lines(runs: Sequence[ScenarioRun]) -> list[str]:
    lines: list[str] = []
    for run in runs:
        for text in run.errors + run.notes:
            lines += [f"- {run.scenario.name}, {text.splitlines()[0]}"]
            rest = text.splitlines()[1:]
            if rest:
                lines += ["", "  ```", *(f"  {x}" for x in rest), "  ```", ""]
    return lines


def write_outputs(
    out: Path, cfg: Config, info: Mapping[str, Any], runs: Sequence[ScenarioRun], markdown: str
) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    base = out / f"core-{'quick-' if cfg.quick else ''}{stamp}"
    data = {
        "info": dict(info),
        "config": asdict(cfg),
        "scenarios": [
            {
                "name": run.scenario.name,
                "params": dict(run.scenario.params),
                "samples": run.samples,
                "errors": run.errors,
                "notes": run.notes,
                "results": [
                    {
                        "metric": r.metric.key,
                        "label": r.metric.label,
                        "unit": r.metric.unit,
                        "median": r.median,
                        "min": r.low,
                        "max": r.high,
                        "values": r.values,
                    }
                    for r in run.results(str(info["system"]))
                ],
            }
            for run in runs
        ],
    }
    json_path, md_path = base.with_suffix(".json"), base.with_suffix(".md")
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    md_path.write_text(markdown)
    return json_path, md_path


# -- command line --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.core", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="5,000 jobs, 1 repetition, 3 s latency")
    p.add_argument("--repeat", type=int, help="repetitions per scenario (default 3; quick 1)")
    p.add_argument("--jobs", type=int, help="jobs per scenario (default 20,000; quick 5,000)")
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results", help="results directory")
    p.add_argument("--system", choices=sorted(SYSTEMS), default="drumbeat")
    p.add_argument("--note", default="", help="free text recorded with the results")
    args = p.parse_args(argv)
    for name in ("repeat", "jobs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name} must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = Config(
        jobs=args.jobs or (5_000 if args.quick else 20_000),
        repeat=args.repeat or (1 if args.quick else 3),
        quick=args.quick,
        latency_seconds=3.0 if args.quick else 10.0,
    )
    command = command_line()
    print(f"$ {command}", file=sys.stderr, flush=True)
    with RedisServer() as server:
        system = SYSTEMS[args.system](server.url)
        try:
            info = machine_info(server, system)
            _progress("warming up")
            warm_up(system)
            runs = [run_scenario(system, s, cfg) for s in scenarios(cfg)]
        finally:
            system.close()
    info["load_end"] = list(os.getloadavg())
    body = [
        f"# {info['system']} core benchmark",
        "",
        *header_lines(command, info, cfg, args.note),
        "",
        *table_lines(runs, args.system),
    ]
    problems = problem_lines(runs)
    if problems:
        body += ["", "## Problems and worker warnings", "", *problems]
    markdown = "\n".join(body) + "\n"
    print(markdown)
    json_path, md_path = write_outputs(args.out, cfg, info, runs, markdown)
    print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    return 1 if any(run.errors for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
